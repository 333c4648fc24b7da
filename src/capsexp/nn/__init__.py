"""Capsule operations and layers (pure ``torch.nn``)."""

from capsexp.config.routing_options import (
    EM_PAPER,
    AttentionRouting,
    DynamicRouting,
    EfficientRouting,
    EMRouting,
    RandomRouting,
    Routing,
    RoutingOptions,
    SelfRouting,
    SinkhornRouting,
    UniformRouting,
    VBRouting,
)
from capsexp.nn.functional import dynamic_routing, em_routing, fully_connected_routing, margin_loss, spread_loss, squash
from capsexp.nn.matrix_capsules import (
    ClassMatrixCapsules,
    ConvMatrixCapsules,
    EMRouter,
    PrimaryMatrixCapsules,
    VBMatrixRouter,
    WindowRouter,
)
from capsexp.nn.resnet_stem import Backbone, ResNetStem
from capsexp.nn.vector_capsules import PrimaryCapsules, RoutingCapsules

__all__ = [
    "EM_PAPER",
    "AttentionRouting",
    "Backbone",
    "ClassMatrixCapsules",
    "ConvMatrixCapsules",
    "DynamicRouting",
    "EMRouter",
    "EMRouting",
    "EfficientRouting",
    "PrimaryCapsules",
    "PrimaryMatrixCapsules",
    "RandomRouting",
    "ResNetStem",
    "Routing",
    "RoutingCapsules",
    "RoutingOptions",
    "SelfRouting",
    "SinkhornRouting",
    "UniformRouting",
    "VBMatrixRouter",
    "VBRouting",
    "WindowRouter",
    "dynamic_routing",
    "em_routing",
    "fully_connected_routing",
    "margin_loss",
    "spread_loss",
    "squash",
]
