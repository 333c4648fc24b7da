"""Capsule operations as plain functions: the one public import path for each.

Each routing procedure is in a file named for it: dynamic routing (Sabour, Frosst & Hinton 2017) in
``_dynamic_routing.py``; EM routing (Hinton, Sabour & Frosst 2018, Procedure 1) in ``_em_routing.py``;
self-routing (Hahn et al. 2019) in ``_self_routing.py``, inverted dot-product attention routing (Tsai et
al. 2020) in ``_attention_routing.py``, Efficient-CapsNet's self-attention routing (Mazzia et al. 2021) in
``_efficient_routing.py``, routing as optimal transport (Sinkhorn-Knopp) in ``_sinkhorn_routing.py``,
variational Bayes routing (Ribeiro et al. 2020) in ``_vb_routing.py`` (EM and VB routing run on the
machinery of ``_gaussian_routing.py``, their votes held as ``_gaussian_votes.py`` holds them), and the
baselines that do not route by agreement (uniform and random couplings) with the result they all return
in ``_routing.py``. The squash is in ``_squash.py``, the losses in ``_margin_loss.py`` and
``_spread_loss.py``; how far an assignment is from uniform (whether routing routes) in ``_engagement.py``;
whether a graph is being captured for export in ``_exporting.py``. Import them from here::

    from capsexp.nn.functional import dynamic_routing, em_routing
"""

from capsexp.nn.functional._attention_routing import attention_routing
from capsexp.nn.functional._dynamic_routing import (
    RoutingTrace,
    dynamic_routing,
    dynamic_routing_trace,
    fully_connected_routing,
)
from capsexp.nn.functional._efficient_routing import efficient_routing, efficient_squash
from capsexp.nn.functional._em_routing import COST_NORMALIZATIONS, CostNormalization, em_routing, inverse_temperatures
from capsexp.nn.functional._engagement import (
    Engagement,
    image_dependence,
    predicted_share,
    responsibility_entropy,
    routing_engagement,
    shares,
    uniform_distance,
)
from capsexp.nn.functional._exporting import exporting
from capsexp.nn.functional._gaussian_votes import VoteMaker
from capsexp.nn.functional._margin_loss import margin_loss
from capsexp.nn.functional._routing import Routed, coupled, random_routing, shuffled_couplings, uniform_routing
from capsexp.nn.functional._self_routing import self_routing
from capsexp.nn.functional._sinkhorn_routing import sinkhorn_routing
from capsexp.nn.functional._spread_loss import spread_loss
from capsexp.nn.functional._squash import squash
from capsexp.nn.functional._vb_routing import VBRouted, vb_routing

__all__ = [
    "COST_NORMALIZATIONS",
    "CostNormalization",
    "Engagement",
    "Routed",
    "RoutingTrace",
    "VBRouted",
    "VoteMaker",
    "attention_routing",
    "coupled",
    "dynamic_routing",
    "dynamic_routing_trace",
    "efficient_routing",
    "efficient_squash",
    "em_routing",
    "exporting",
    "fully_connected_routing",
    "image_dependence",
    "inverse_temperatures",
    "margin_loss",
    "predicted_share",
    "random_routing",
    "responsibility_entropy",
    "routing_engagement",
    "self_routing",
    "shares",
    "shuffled_couplings",
    "sinkhorn_routing",
    "spread_loss",
    "squash",
    "uniform_distance",
    "uniform_routing",
    "vb_routing",
]
