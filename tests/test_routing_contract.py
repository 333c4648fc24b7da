"""capsexp.testing's contract kit, run over every built-in routing (one kit: the checks a routing's author
runs are the ones capsexp's own routings pass), and shown to fail routings that break the contract."""

from __future__ import annotations

import pytest
import torch

from capsexp.config.routing_registry import built_in
from capsexp.nn.functional import Routed
from capsexp.testing import RoutingContract

ROUTINGS = built_in()  # capsexp's own, whatever else is installed

# Where a built-in legitimately differs from the defaults of the kit, and why (docs/own_routing.md).
DIFFERS = {
    # Learned parameters of their own per child: the children's order matters.
    "self": {"children_interchangeable": False},
    # Fresh couplings at every call: compared under one seed only.
    "random": {"draws": True},
    # The agreement is an unscaled dot product of each vote with the votes' sum (Mazzia et al. 2021, and
    # their code): about I |u|^2 / sqrt(D) = 7,000 on the kit's ill-conditioned votes, where float32's
    # relative rounding is 4e-4 of absolute logit error; activations within 1.3e-3 of float64 (measured).
    "efficient": {"children_interchangeable": False, "float64_tolerance": 2e-3},
}


def _contract(name: str) -> type[RoutingContract]:
    return type(f"Test{name.title()}Routing", (RoutingContract,), {"routing": ROUTINGS[name], **DIFFERS.get(name, {})})


CHECKS = [name for name in dir(RoutingContract) if name.startswith("test_")]
ONNX = "test_onnx_gives_its_outputs"


# ONNX's exporter takes seconds per routing: make test-all exports every one (the fast suite exports CapsNet
# with dynamic routing to ONNX in tests/test_export.py).
@pytest.mark.parametrize(
    "name,check",
    [pytest.param(name, check, marks=[pytest.mark.slow] * (check == ONNX)) for name in ROUTINGS for check in CHECKS],
)
def test_every_built_in_routing_meets_the_contract(name, check):
    getattr(_contract(name)(), check)()


class _Scaled(torch.nn.Module):
    """A router whose couplings are 1.5 times what they should be."""

    def __init__(self, router: torch.nn.Module) -> None:
        super().__init__()
        self.router = router

    def forward(self, votes, children, activations) -> Routed:
        routed = self.router(votes, children, activations)
        return Routed(routed.poses, routed.activations, routed.assignment * 1.5)


class _MixesImages(torch.nn.Module):
    """A router that normalises over the whole batch: an image's parents depend on the others."""

    def __init__(self, router: torch.nn.Module) -> None:
        super().__init__()
        self.router = router

    def forward(self, votes, children, activations) -> Routed:
        return self.router(votes - votes.mean(dim=0, keepdim=True), children, activations)


@pytest.mark.parametrize(
    "broken,check",
    [(_Scaled, "test_each_childs_assignment_sums_to_one"), (_MixesImages, "test_each_image_is_routed_on_its_own")],
)
def test_the_kit_fails_a_routing_that_breaks_the_contract(broken, check):
    class Broken(RoutingContract):
        routing = ROUTINGS["dynamic"]

        def layer(self, dtype=torch.float32, seed=0):
            layer = super().layer(dtype, seed)
            layer.router = broken(layer.router)
            return layer

    getattr(_contract("dynamic")(), check)()  # the intact routing passes the check
    with pytest.raises(AssertionError):
        getattr(Broken(), check)()
