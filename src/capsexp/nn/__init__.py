"""Capsule operations and layers (pure ``torch.nn``)."""

from capsexp.nn.capsnet import DynamicRouting, PrimaryCapsules, RoutingCapsules
from capsexp.nn.em_caps import ClassMatrixCapsules, ConvMatrixCapsules, EMRouter, EMRouting, PrimaryMatrixCapsules
from capsexp.nn.functional import dynamic_routing, em_routing, fully_connected_routing, margin_loss, spread_loss, squash

__all__ = [
    "ClassMatrixCapsules",
    "ConvMatrixCapsules",
    "DynamicRouting",
    "EMRouter",
    "EMRouting",
    "PrimaryCapsules",
    "PrimaryMatrixCapsules",
    "RoutingCapsules",
    "dynamic_routing",
    "em_routing",
    "fully_connected_routing",
    "margin_loss",
    "spread_loss",
    "squash",
]
