"""Capsule operations and layers (pure ``torch.nn``)."""

from capsexp.nn.capsules import PrimaryCapsules, RoutingCapsules
from capsexp.nn.functional import dynamic_routing, fully_connected_routing, margin_loss, squash

__all__ = ["PrimaryCapsules", "RoutingCapsules", "dynamic_routing", "fully_connected_routing", "margin_loss", "squash"]
