"""capsexp.testing's contract kit, run over every built-in routing (one kit: the checks a routing's author
runs are the ones capsexp's own routings pass), and shown to fail routings that break the contract."""

from __future__ import annotations

import dataclasses
import warnings
from typing import ClassVar

import pytest
import torch

from capsexp.config.routing_registry import built_in
from capsexp.nn import Routing
from capsexp.nn.functional import Routed, squash
from capsexp.testing import RoutingContract, assert_trains

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


class _ReadsPlace(torch.nn.Module):
    """A router that adds to each image's votes a term of its place in the batch."""

    def __init__(self, router: torch.nn.Module) -> None:
        super().__init__()
        self.router = router

    def forward(self, votes, children, activations) -> Routed:
        place = torch.arange(votes.shape[0], dtype=votes.dtype).view(-1, 1, 1, 1)
        return self.router(votes + 0.1 * place, children, activations)


class _AssignmentInItsOwnOrder(torch.nn.Module):
    """A router whose returned assignment lists the children by their votes' length, not in their order
    (the parents it computes are right)."""

    def __init__(self, router: torch.nn.Module) -> None:
        super().__init__()
        self.router = router

    def forward(self, votes, children, activations) -> Routed:
        routed = self.router(votes, children, activations)
        order = votes.norm(dim=-1).sum(dim=-1).argsort(dim=1)  # (B, I): the children shortest first
        assignment = routed.assignment.gather(1, order[..., None].expand_as(routed.assignment))
        return Routed(routed.poses, routed.activations, assignment)


# Each broken router, the check that catches it, and what its message must say: the case that failed and
# the likely cause a routing's author acts on.
BROKEN = [
    (_Scaled, "test_each_childs_assignment_sums_to_one", "each child's assignment summed over the parents", "dim=-1"),
    (_MixesImages, "test_each_image_is_routed_on_its_own", "the image alone", "reduces over the batch"),
    (_ReadsPlace, "test_each_image_is_routed_on_its_own", "the permuted batch", "an image's place"),
    (
        _AssignmentInItsOwnOrder,
        "test_the_order_of_the_children_does_not_matter",
        "the children permuted: the assignment",
        "not in the children's order",
    ),
]


@pytest.mark.parametrize("broken,check,case,cause", BROKEN)
def test_the_kit_fails_a_routing_that_breaks_the_contract_naming_the_case_and_its_likely_cause(
    broken, check, case, cause
):
    class Broken(RoutingContract):
        routing = ROUTINGS["dynamic"]

        def layer(self, *arguments, **options):
            layer = super().layer(*arguments, **options)
            layer.router = broken(layer.router)
            return layer

    getattr(_contract("dynamic")(), check)()  # the intact routing passes the check
    with pytest.raises(AssertionError) as failed:
        getattr(Broken(), check)()
    message = str(failed.value)
    assert message.startswith(case), message
    assert "Likely cause:" in message and cause in message, message


@pytest.mark.parametrize(
    "declared,check,reason",
    [
        (
            {"assignment_sums_to_one": False},
            "test_each_childs_assignment_sums_to_one",
            "assignment_sums_to_one = False",
        ),
        (
            {"children_interchangeable": False},
            "test_the_order_of_the_children_does_not_matter",
            "children_interchangeable",
        ),
        ({"draws": True}, "test_the_order_of_the_children_does_not_matter", "draws = True"),
        ({"draws": True}, "test_each_image_is_routed_on_its_own", "draws = True"),
        ({"draws": True}, "test_float32_stays_close_to_float64_on_ill_conditioned_votes", "draws = True"),
        ({"draws": True}, "test_torchscript_gives_its_outputs", "draws = True"),
        ({"draws": True}, "test_onnx_gives_its_outputs", "draws = True"),
    ],
)
def test_a_check_a_routing_opts_out_of_is_reported_skipped_with_its_reason(declared, check, reason):
    declaring = type("TestDeclares", (RoutingContract,), {"routing": ROUTINGS["dynamic"], **declared})
    with pytest.raises(pytest.skip.Exception, match=f"TestDeclares declares {reason}"):
        getattr(declaring(), check)()


@dataclasses.dataclass(frozen=True)
class MeanAgreement(Routing):
    """Agreement routing in one pass, as docs/own_routing.md's example, its agreement detached or not."""

    detach: bool = False
    detach_returned: bool = False  # the couplings returned detached (the poses' path intact)
    router: ClassVar[str] = "tests.test_routing_contract:mean_agreement"


def mean_agreement(votes: torch.Tensor, options: MeanAgreement) -> Routed:
    agreement = (votes * votes.mean(dim=1, keepdim=True)).sum(dim=-1)
    couplings = torch.softmax(agreement.detach() if options.detach else agreement, dim=-1)
    poses = squash((couplings.unsqueeze(-1) * votes).sum(dim=1))
    return Routed(poses, poses.norm(dim=-1), couplings.detach() if options.detach_returned else couplings)


def test_a_routing_whose_couplings_are_returned_without_their_gradient_fails_the_kit_in_one_line():
    """The poses' gradient intact (gradcheck of the poses would pass), the assignment returned detached: a
    loss on the couplings (an entropy penalty) would give the votes 0. The kit says so."""

    class Detached(RoutingContract):
        routing = MeanAgreement(detach_returned=True)

    Detached().test_the_votes_get_gradient_through_the_couplings()  # the poses' path is intact
    with pytest.raises(AssertionError) as failed:
        Detached().test_the_couplings_carry_their_gradient()
    message = str(failed.value)
    assert message.startswith("the couplings returned carry no gradient at all") and "\n" not in message, message
    type("Intact", (RoutingContract,), {"routing": MeanAgreement()})().test_the_couplings_carry_their_gradient()


GRADIENT_CHECKS = ["test_gradients_are_autograds_numerical_ones", "test_the_votes_get_gradient_through_the_couplings"]
# Routings that hold their couplings constant in the backward pass: capsexp's own options, and a routing
# of one's own written with .detach().
TRUNCATED = {
    "dynamic detach_agreement=true": dataclasses.replace(ROUTINGS["dynamic"], detach_agreement=True),
    "em detach_responsibilities=true": dataclasses.replace(ROUTINGS["em"], detach_responsibilities=True),
    "mean agreement, detached": MeanAgreement(detach=True),
}


@pytest.mark.parametrize("name", TRUNCATED)
def test_a_routing_that_truncates_its_gradient_passes_under_its_declaration_and_skips_gradcheck(name):
    class Declared(RoutingContract):
        routing = TRUNCATED[name]
        gradient_through_couplings = False

    Declared().test_the_votes_get_gradient_through_the_couplings()
    with pytest.raises(pytest.skip.Exception, match="declares gradient_through_couplings = False"):
        Declared().test_gradients_are_autograds_numerical_ones()


@pytest.mark.parametrize("name", TRUNCATED)
def test_a_routing_that_truncates_its_gradient_undeclared_is_told_so_in_a_few_lines(name):
    class Undeclared(RoutingContract):
        routing = TRUNCATED[name]

    with pytest.raises(AssertionError) as failed:
        Undeclared().test_the_votes_get_gradient_through_the_couplings()
    message = str(failed.value)
    assert message.startswith("the votes get no gradient through the couplings: ") and "\n" not in message, message
    assert "gradient_through_couplings = False" in message
    # gradcheck's own message prints both Jacobians whole (over 100 lines here): the kit's is one line.
    with pytest.raises(AssertionError) as failed:
        Undeclared().test_gradients_are_autograds_numerical_ones()
    message = str(failed.value)
    assert message.startswith("the gradient of the poses with respect to the votes is not that of finite differences")
    assert "\n" not in message and "tensor(" not in message, message


def test_a_routing_whose_couplings_pass_gradient_is_told_its_declaration_is_wrong():
    class Declared(RoutingContract):
        routing = MeanAgreement()
        gradient_through_couplings = False

    for check in GRADIENT_CHECKS:  # the intact routing passes both without the declaration
        getattr(type("Intact", (RoutingContract,), {"routing": MeanAgreement()})(), check)()
    with pytest.raises(AssertionError, match="it passes through the couplings; drop the declaration"):
        Declared().test_the_votes_get_gradient_through_the_couplings()


@pytest.mark.slow  # ONNX's exporter takes seconds
def test_the_onnx_check_exports_the_router_in_evaluation_mode():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _contract("uniform")().test_onnx_gives_its_outputs()
    shown = [str(warning.message) for warning in caught]
    assert not [message for message in shown if "training mode" in message], shown


@pytest.mark.slow
def test_assert_trains_runs_the_command_and_names_it_when_it_fails(tmp_path):
    """The kit's training check: the IDX files it writes are read as MNIST's (a run of uniform coupling in
    em_caps_small trains and validates); a routing that is not registered fails with the command it ran
    and capsexp's answer (a usage error, exit 2), not a bare exit status."""
    run = assert_trains("em_caps_small", "uniform", tmp_path / "good", steps=2)
    assert (run / "checkpoints" / "last.ckpt").is_file()
    with pytest.raises(AssertionError) as failed:
        assert_trains("capsnet_small", "max_mni", tmp_path / "bad")
    message = str(failed.value)
    assert "model/routing=max_mni" in message and "exited 2" in message and "max_mni" in message.split("\n", 1)[1]


def test_assert_trains_fails_a_loss_that_turns_nan_after_its_first_step():
    """The logged training losses checked every one: finite at step 0 and NaN from step 2 fails, naming the
    losses; without a val/acc, it fails naming the tags logged."""
    from capsexp.testing.runs import _assert_logged_training

    steps = [(0, 2.3), (1, 2.1), (2, float("nan")), (3, float("nan"))]
    with pytest.raises(AssertionError, match=r"the command: the training loss \[2.3, 2.1, nan, nan\]"):
        _assert_logged_training({"train/loss_step": steps, "val/acc": [(3, 0.5)]}, "the command")
    with pytest.raises(AssertionError, match=r"no val/acc logged \(tags: \['train/loss_step'\]\)"):
        _assert_logged_training({"train/loss_step": steps[:2]}, "the command")
    _assert_logged_training({"train/loss_step": steps[:2], "val/acc": [(1, 0.5)]}, "the command")
