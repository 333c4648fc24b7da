"""Capsule operations and layers (pure ``torch.nn``)."""

from capsexp.nn.capsules import PrimaryCapsules, RoutingCapsules
from capsexp.nn.functional import dynamic_routing, em_routing, fully_connected_routing, margin_loss, spread_loss, squash
from capsexp.nn.matrix_capsules import ClassMatrixCapsules, ConvMatrixCapsules, PrimaryMatrixCapsules

__all__ = [
    "ClassMatrixCapsules",
    "ConvMatrixCapsules",
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
