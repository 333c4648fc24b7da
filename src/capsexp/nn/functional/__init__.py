"""Capsule operations as plain functions: the one public import path for each.

Dynamic routing (Sabour, Frosst & Hinton 2017) is in ``_capsnet.py``; EM routing (Hinton, Sabour &
Frosst 2018, Procedure 1) in ``_em_caps.py``. Import them from here::

    from capsexp.nn.functional import dynamic_routing, em_routing
"""

from capsexp.nn.functional._capsnet import (
    RoutingTrace,
    dynamic_routing,
    dynamic_routing_trace,
    fully_connected_routing,
    margin_loss,
    squash,
)
from capsexp.nn.functional._em_caps import (
    COST_NORMALIZATIONS,
    CostNormalization,
    em_routing,
    inverse_temperatures,
    responsibility_entropy,
    spread_loss,
)

__all__ = [
    "COST_NORMALIZATIONS",
    "CostNormalization",
    "RoutingTrace",
    "dynamic_routing",
    "dynamic_routing_trace",
    "em_routing",
    "fully_connected_routing",
    "inverse_temperatures",
    "margin_loss",
    "responsibility_entropy",
    "spread_loss",
    "squash",
]
