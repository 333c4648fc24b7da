"""The checks every routing algorithm should pass, for a routing's author to run from their own tests:

    from capsexp.testing import RoutingContract

    class TestMyRouting(RoutingContract):
        routing = MyRouting(iterations=3)

pytest collects the ``test_*`` methods below for that class. Each routes random votes through the router
a fully connected capsule layer builds for ``routing`` (:class:`capsexp.nn.RoutingCapsules`: I children
of ``in_dim`` dimensions, J parents of ``out_dim``), called as every router is,

    router(votes (B, I, J, D), children (B, I, in_dim), child_activations (B, I)) -> Routed

and checks one convention of the capsule literature (docs/own_routing.md says where each comes from). A
failed check says which case failed and its likely cause. A method that legitimately differs says so by a
class attribute, with its reason in the docs; the checks it opts out of are reported skipped, with the
attribute that skips them:

- ``assignment_sums_to_one`` (True): each child's assignment over the parents sums to 1 (Sabour et al.
  2017's couplings, a softmax over parents; EM's responsibilities). False for a method whose couplings
  are bounded one by one instead (a "none of the above" parent takes a share; max-min normalisation maps
  each onto its bounds);
- ``children_interchangeable`` (True): the children's order does not matter. False for a router with
  learned parameters of its own per child (self routing's routing weights, efficient routing's priors);
- ``draws`` (False): True for a method that draws at random at every call (random couplings): the checks
  that compare two calls compare them under the same seed, and those that cannot (the children's or the
  batch's order, float32 against float64, export) are not run;
- ``gradient_through_couplings`` (True): the votes' gradient flows through the couplings too, as
  through the parents' weighted sums (Sabour et al. 2017 and Hinton et al. 2018 backpropagate through the
  routing iterations). False for a routing that holds its couplings constant in the backward pass on
  purpose (dynamic routing's ``detach_agreement=true``, EM's ``detach_responsibilities=true``, as some
  public ports do): the votes' gradient is then checked to be there but not compared with finite
  differences;
- ``float64_tolerance`` (1e-3): how far float32 may be from float64 on ill-conditioned votes.

The sizes are unequal (I=7 children of 5 dimensions, J=4 parents of 6, batch 3), so that a transposed axis
does not go unnoticed.

That the routing trains in capsexp's nets, from the command line as a user runs it:
:func:`assert_trains` (``assert_trains("em_caps_small", "<your routing>", tmp_path)``), on a few hundred
synthetic digits written as MNIST's official IDX files (:func:`write_synthetic_mnist`).

For a study's results page, :func:`assert_page_rebuilds` checks that its kept runs write it again, byte for
byte.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.autograd.gradcheck import GradcheckError

from capsexp.nn import RoutingCapsules
from capsexp.nn.functional import Routed, routing_engagement

# Votes of each kind a layer meets: (name, a function of random votes of unit scale).
EXTREME_VOTES: tuple[tuple[str, Callable[[torch.Tensor], torch.Tensor]], ...] = (
    ("tiny", lambda votes: votes * 1e-8),
    ("huge", lambda votes: votes * 1e4),
    ("identical for every child", lambda votes: votes[:, :1].expand_as(votes).clone()),
    ("zero", torch.zeros_like),
)


Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # votes, children, child activations
INPUTS = ("votes", "children", "child activations")
OUTPUTS = ("poses", "activations", "assignment")

# The likely causes of a failed check, where several checks share one.
BATCH_MIXED = (
    "the router reduces over the batch (a mean, a norm or a normalisation over dim 0 of the votes) or "
    "reads an image's place in it"
)
NOT_FINITE = "a division by a norm or a sum that can be 0, an exp that overflows (subtract the max first), a log of 0"
NOT_TRACEABLE = (
    "Python control flow on a tensor's values (an if or a loop on .item(), a while until convergence) or "
    "a shape read as a number is fixed at the traced inputs"
)


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, case: str, cause: str, **tolerance: float) -> None:
    """torch.testing.assert_close, its message headed by the case that failed and its likely cause."""
    torch.testing.assert_close(
        actual, expected, **tolerance, msg=lambda detail: f"{case}: {detail}\nLikely cause: {cause}."
    )


class RoutingContract:
    """Subclass with ``routing`` set to a routing's options (see the module docstring)."""

    routing: Any = None
    assignment_sums_to_one: bool = True
    children_interchangeable: bool = True
    draws: bool = False
    gradient_through_couplings: bool = True
    float64_tolerance: float = 1e-3
    batch, in_caps, in_dim, out_caps, out_dim = 3, 7, 5, 4, 6

    # ---- what the checks share --------------------------------------------------------------------
    def layer(self, dtype: torch.dtype = torch.float32, seed: int = 0, small: bool = False) -> RoutingCapsules:
        """The capsule layer of ``routing``, its learned parameters moved off their initial values (a
        check must not pass only because they start at zero); ``small``: 4 children of 3 dimensions, 3
        parents of 3 (finite differences take two passes per input)."""
        assert self.routing is not None, f"{type(self).__name__}: set routing = <your routing's options>"
        torch.manual_seed(seed)
        sizes = (4, 3, 3, 3) if small else (self.in_caps, self.in_dim, self.out_caps, self.out_dim)
        layer = RoutingCapsules(*sizes, routing=self.routing)
        with torch.no_grad():
            for parameter in layer.router.parameters():
                parameter.add_(0.1 * torch.randn_like(parameter))
        return layer.to(dtype).eval()

    def inputs(
        self, dtype: torch.dtype = torch.float32, seed: int = 1, small: bool = False
    ) -> tuple[torch.Tensor, ...]:
        """Votes (B, I, J, D), children (B, I, in_dim) and their activations (B, I) in (0, 1); ``small``: one
        image for :meth:`layer`'s small layer."""
        generator = torch.Generator().manual_seed(seed)
        batch, in_caps, in_dim, out_caps, out_dim = (1, 4, 3, 3, 3) if small else (
            self.batch, self.in_caps, self.in_dim, self.out_caps, self.out_dim
        )  # fmt: skip
        votes = torch.randn(batch, in_caps, out_caps, out_dim, generator=generator, dtype=torch.float64).to(dtype)
        children = torch.randn(batch, in_caps, in_dim, generator=generator, dtype=torch.float64)
        activations = torch.rand(batch, in_caps, generator=generator, dtype=torch.float64)
        return votes, children.to(dtype), (0.05 + 0.9 * activations).to(dtype)

    def route(
        self, layer: RoutingCapsules, votes: torch.Tensor, children: torch.Tensor, activations: torch.Tensor
    ) -> Routed:
        with self._same_draws():
            return layer.router(votes, children, activations)

    def _skip_unless(self, runs: bool, declared: str, why: str) -> None:
        """Report the check skipped, naming the declaration that opts out of it, where ``runs`` is false."""
        if not runs:
            pytest.skip(f"{type(self).__name__} declares {declared}: {why}")

    def _skip_if_draws(self, why: str) -> None:
        self._skip_unless(not self.draws, "draws = True", why)

    @contextlib.contextmanager
    def _same_draws(self, seed: int = 2) -> Iterator[None]:
        """For a routing that draws: every call under the same seed, the global generator put back."""
        if not self.draws:
            yield
            return
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            yield

    # ---- the checks -------------------------------------------------------------------------------
    def test_shapes_and_ranges(self) -> None:
        """Poses (B, J, D), activations (B, J) in [0, 1], an assignment (B, I, J) of weights in [0, 1]."""
        routed = self.route(self.layer(), *self.inputs())
        sizes = f"batch {self.batch}, {self.in_caps} children, {self.out_caps} parents of {self.out_dim} dimensions"
        expected = {
            "poses": (self.batch, self.out_caps, self.out_dim),
            "activations": (self.batch, self.out_caps),
            "assignment": (self.batch, self.in_caps, self.out_caps),
        }
        assert routed.assignment is not None, "the router keeps no assignment: return the couplings in Routed"
        for part, shape in expected.items():
            got = tuple(getattr(routed, part).shape)
            assert got == shape, (
                f"{part} of shape {got} where {shape} is expected ({sizes}). Likely cause: a sum over the wrong "
                "axis of the votes (B, I, J, D), or a transposed result"
            )
        outside = (routed.activations < 0) | (routed.activations > 1)
        assert not outside.any(), (
            f"activations outside [0, 1] (from {routed.activations.min():.3g} to {routed.activations.max():.3g}). "
            "Likely cause: an activation that is not a squashed pose's length or a sigmoid (poses.norm(dim=-1) "
            "of unsquashed poses)"
        )
        outside = (routed.assignment < 0) | (routed.assignment > 1 + 1e-6)
        assert not outside.any(), (
            f"assignment outside [0, 1] (from {routed.assignment.min():.3g} to {routed.assignment.max():.3g}). "
            "Likely cause: the routing logits returned in place of the couplings"
        )

    def test_each_childs_assignment_sums_to_one(self) -> None:
        """Sum over parents j of c_ij = 1 for every child i, where the method says so (each weight in [0, 1]
        is checked by :meth:`test_shapes_and_ranges` either way)."""
        self._skip_unless(
            self.assignment_sums_to_one,
            "assignment_sums_to_one = False",
            "its couplings are bounded one by one, not a distribution over the parents",
        )
        sums = self.route(self.layer(), *self.inputs()).assignment.sum(dim=-1)
        _assert_close(
            sums, torch.ones_like(sums), "each child's assignment summed over the parents",
            "the couplings normalised over the children (a softmax over dim=1 of (B, I, J)) instead of the "
            "parents (dim=-1), or a share left to a parent that is dropped (then declare "
            "assignment_sums_to_one = False)",
            atol=1e-5, rtol=0,
        )  # fmt: skip

    def test_the_order_of_the_children_does_not_matter(self) -> None:
        """Children permuted: the same parents, each child's assignment moved with it."""
        self._skip_unless(
            self.children_interchangeable,
            "children_interchangeable = False",
            "a router with learned parameters per child: the children's order matters",
        )
        self._skip_if_draws("two calls on permuted children draw different couplings")
        layer, (votes, children, activations) = self.layer(), self.inputs()
        order = torch.tensor([3, 0, 6, 1, 5, 2, 4][: self.in_caps])
        routed = self.route(layer, votes, children, activations)
        permuted = self.route(layer, votes[:, order], children[:, order], activations[:, order])
        cause = (
            "the router reads a child's place (a parameter or a constant per child index, a cumulative sum "
            "over children), or its assignment's rows are not in the children's order (then declare "
            "children_interchangeable = False if it has parameters per child)"
        )
        expected = {"poses": routed.poses, "activations": routed.activations, "assignment": routed.assignment[:, order]}
        for part, value in expected.items():
            case = f"the children permuted: the {part}" + " (its rows permuted with them)" * (part == "assignment")
            _assert_close(getattr(permuted, part), value, case, cause, atol=1e-5, rtol=1e-4)

    def test_each_image_is_routed_on_its_own(self) -> None:
        """In evaluation, an image's parents do not depend on the other images of its batch, nor on its place."""
        self._skip_if_draws("two calls on other batches draw different couplings")
        layer, (votes, children, activations) = self.layer(), self.inputs()
        routed = self.route(layer, votes, children, activations)
        order = torch.tensor([2, 0, 1])
        permuted = self.route(layer, votes[order], children[order], activations[order])
        alone = self.route(layer, votes[1:2], children[1:2], activations[1:2])
        cases = (
            (permuted, order, "the permuted batch (images 2, 0, 1)"),
            (alone, torch.tensor([1]), "the image alone (image 1 as a batch of one)"),
        )
        for other, index, case in cases:
            for part in OUTPUTS:
                expected = getattr(routed, part)[index]
                _assert_close(getattr(other, part), expected, f"{case}: {part}", BATCH_MIXED, atol=1e-5, rtol=1e-4)

    def test_finite_values_and_gradients_at_extreme_inputs(self) -> None:
        """Tiny, huge, identical and zero votes, and children whose activations are all zero: parents,
        assignment and the gradients of votes, children and the router's parameters all finite."""
        cases = [(name, change, False) for name, change in EXTREME_VOTES] + [("zero activations", None, True)]
        for name, change, silent in cases:
            layer = self.layer()
            votes, children, activations = self.inputs()
            votes = (change(votes) if change else votes).requires_grad_()
            children = children.requires_grad_()
            activations = (torch.zeros_like(activations) if silent else activations).requires_grad_()
            routed = self.route(layer, votes, children, activations)
            case = name if silent else f"{name} votes"
            for part, value in zip(OUTPUTS, routed, strict=True):
                assert torch.isfinite(value).all(), f"{case}: {part} not finite. Likely cause: {NOT_FINITE}"
            (routed.poses.square().sum() + routed.activations.sum() + routed.assignment.square().sum()).backward()
            gradients = {"votes": votes.grad, "children": children.grad, "child activations": activations.grad}
            gradients.update({n: p.grad for n, p in layer.router.named_parameters()})
            for part, gradient in gradients.items():
                assert gradient is None or torch.isfinite(gradient).all(), (
                    f"{case}: the gradient of the {part} not finite. Likely cause: {NOT_FINITE} (a norm's "
                    "gradient at 0 is 0/0: sqrt(sum of squares + eps))"
                )

    def test_float32_stays_close_to_float64_on_ill_conditioned_votes(self) -> None:
        """Votes that nearly agree far from the origin (an offset of 20, a spread of 0.03): float32 within
        ``float64_tolerance`` of float64 in activations and assignment, relative to the poses' scale."""
        self._skip_if_draws("float32 and float64 draw different couplings")
        votes, children, activations = self.inputs(torch.float64)
        votes = 20.0 + 0.03 * votes
        exact = self.route(self.layer(torch.float64), votes, children, activations)
        single = self.route(self.layer(torch.float32), votes.float(), children.float(), activations.float())
        tolerance = self.float64_tolerance
        scale = exact.poses.abs().max().clamp_min(1.0)
        for part, allowed in (("activations", tolerance), ("assignment", tolerance), ("poses", tolerance * scale)):
            error = (getattr(single, part).double() - getattr(exact, part)).abs().max()
            assert error <= allowed, (
                f"votes that nearly agree far from the origin (20 + 0.03 N(0, 1)): the {part} in float32 are "
                f"{error:.3g} from float64's (at most {allowed:.3g}: float64_tolerance {tolerance:g}"
                + (" times the poses' scale" if part == "poses" else "")
                + "). Likely cause: a difference of large, nearly equal numbers (a variance as E[x^2] - E[x]^2, "
                "a softmax of large logits not shifted by their max); a method ill-conditioned by design "
                "declares float64_tolerance"
            )

    def test_gradients_are_autograds_numerical_ones(self) -> None:
        """torch.autograd.gradcheck in float64 on a small layer: the gradients of the parents and the
        assignment with respect to the votes, the children and their activations match finite differences
        (a hand-written backward pass must be right). Skipped under ``gradient_through_couplings = False``:
        whatever reaches the couplings (the votes, and the activations where they weigh the couplings) then
        differs from finite differences by design."""
        self._skip_unless(
            self.gradient_through_couplings,
            "gradient_through_couplings = False",
            "its couplings are constants to the backward pass, so its gradients are not finite differences' "
            "(test_the_votes_get_gradient_through_the_couplings checks that the votes get theirs)",
        )
        layer = self.layer(torch.float64, small=True)
        inputs = tuple(x.requires_grad_() for x in self.inputs(torch.float64, small=True))

        def routed(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(self.route(layer, *inputs))

        try:
            torch.autograd.gradcheck(routed, inputs, eps=1e-6, atol=1e-5, rtol=1e-3)
        except GradcheckError as error:
            raise AssertionError(_gradcheck_summary(str(error), routed, inputs)) from None

    def test_the_votes_get_gradient_through_the_couplings(self) -> None:
        """The gradient of the parents' poses and activations with respect to the votes, by autograd, is
        that of finite differences (float64, a small layer): the couplings, computed from the votes, pass
        their share of it back to them. Under ``gradient_through_couplings = False`` the votes' gradient is
        there and finite, and differs from finite differences (the declaration is true)."""
        layer = self.layer(torch.float64, small=True)
        votes, children, activations = self.inputs(torch.float64, small=True)

        def parents(votes: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(self.route(layer, votes, children, activations))[:2]

        autograds, numerical = _jacobians(parents, (votes,), 0)
        largest = numerical.abs().max()
        difference = (autograds - numerical).abs()
        matches = bool((difference <= 1e-5 + 1e-3 * numerical.abs()).all())
        shown = f"up to {difference.max():.3g} where the gradient is up to {largest:.3g}"
        assert torch.isfinite(autograds).all(), "the votes' gradient is not finite (float64, random votes)"
        assert autograds.abs().max() > 0, (
            "the votes get no gradient at all: the parents' poses and activations are constants to the backward "
            "pass. Likely cause: the parents computed under torch.no_grad() or from detached votes"
        )
        if self.gradient_through_couplings:
            assert matches, (
                f"the votes get no gradient through the couplings: autograd's gradient of the parents with respect "
                f"to the votes differs from finite differences by {shown}. Likely cause: couplings computed under "
                "torch.no_grad() or from .detach()ed votes or agreements (or a hand-written backward pass that "
                "leaves them out): the votes learn nothing of how they move the couplings. A routing that "
                "truncates this gradient on purpose declares gradient_through_couplings = False"
            )
        else:
            assert not matches, (
                "gradient_through_couplings = False is declared, but the votes' gradient is that of finite "
                f"differences (within {difference.max():.3g}): it passes through the couplings; drop the declaration"
            )

    def test_the_couplings_carry_their_gradient(self) -> None:
        """A loss on the assignment returned (an entropy penalty on the couplings, say) gives the votes the
        gradient of finite differences (float64, a small layer): the assignment is not marked
        non-differentiable, detached or left out of a hand-written backward pass while it depends on the
        votes. Skipped under ``gradient_through_couplings = False`` (the couplings are constants to the
        backward pass by design)."""
        self._skip_unless(
            self.gradient_through_couplings,
            "gradient_through_couplings = False",
            "its couplings are constants to the backward pass, so a loss on them moves no vote",
        )
        layer = self.layer(torch.float64, small=True)
        votes, children, activations = self.inputs(torch.float64, small=True)

        def assignment(votes: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (self.route(layer, votes, children, activations).assignment,)

        autograds, numerical = _jacobians(assignment, (votes,), 0)
        difference = (autograds - numerical).abs()
        if bool((difference <= 1e-5 + 1e-3 * numerical.abs()).all()):
            return
        carried = "no gradient at all" if not autograds.abs().max() else "another gradient than finite differences'"
        raise AssertionError(
            f"the couplings returned carry {carried}: a loss on them (an entropy penalty) moves the votes by "
            f"up to {difference.max():.3g} less or more than it should, where their finite differences reach "
            f"{numerical.abs().max():.3g}. Likely cause: the assignment marked non-differentiable "
            "(ctx.mark_non_differentiable), .detach()ed, or its gradient left out of a hand-written backward "
            "pass. A routing whose couplings are constants to the backward pass on purpose declares "
            "gradient_through_couplings = False"
        )

    def test_the_same_seed_draws_the_same(self) -> None:
        """Two calls under one seed give the same parents; a routing that draws gives others under another."""
        layer, inputs = self.layer(), self.inputs()
        draws = []
        for seed in (5, 5, 6):
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                draws.append(layer.router(*inputs))
        cause = "the router draws from a generator of its own or from numpy's or Python's random, not torch's"
        case = "two calls under one seed (torch.manual_seed(5)): the poses"
        _assert_close(draws[0].poses, draws[1].poses, case, cause, atol=0, rtol=0)
        if self.draws:
            assert not torch.equal(draws[0].assignment, draws[2].assignment), (
                "two calls under the seeds 5 and 6 drew the same assignment. Likely cause: a generator seeded once, "
                "inside the router, or a routing that does not draw (then drop draws = True)"
            )

    def test_torchscript_gives_its_outputs(self) -> None:
        """The router traced by TorchScript gives its outputs on inputs other than the traced ones."""
        self._skip_if_draws("an exported routing cannot give a drawing router's outputs")
        layer = self.layer()
        expected = self.route(layer, *self.inputs(seed=3))
        with torch.no_grad():
            traced = torch.jit.trace(_Outputs(layer.router).eval(), self.inputs(seed=1), check_trace=False)
            for part, ours, theirs in zip(OUTPUTS, expected, traced(*self.inputs(seed=3)), strict=True):
                case = f"the router traced by TorchScript, on other votes than it was traced on: the {part}"
                _assert_close(theirs, ours, case, NOT_TRACEABLE, atol=1e-4, rtol=1e-4)

    def test_onnx_gives_its_outputs(self) -> None:
        """The router exported to ONNX as ``python -m capsexp.export format=onnx`` exports (torch.export, a
        dynamic batch) and run by ONNX Runtime gives its outputs on another batch size than the traced one.
        Skipped where ONNX Runtime or the exporter is not installed (``pip install 'capsexp[export]'``). The
        router is exported in evaluation mode, as capsexp's export is."""
        self._skip_if_draws("an exported routing cannot give a drawing router's outputs")
        try:
            import onnxruntime
            import onnxscript  # noqa: F401  (torch.onnx's exporter)
        except ImportError:
            pytest.skip("ONNX Runtime or onnxscript is not installed (pip install 'capsexp[export]')")
        from capsexp.use.export import OPSET

        layer = self.layer()
        traced_on, checked_on = self.inputs(seed=1), tuple(x[:2] for x in self.inputs(seed=3))
        expected = self.route(layer, *checked_on)
        batch = torch.export.Dim("batch")
        names = ["votes", "children", "activations"]
        with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            # The three inputs share one batch axis on purpose; the exporter notes that it names it once.
            warnings.filterwarnings("ignore", message=r"# The axis name: batch will not be used")
            program = torch.onnx.export(
                _Outputs(layer.router).eval(), traced_on, dynamo=True, input_names=names, opset_version=OPSET,
                dynamic_shapes=tuple({0: batch} for _ in names), verbose=False,
            )  # fmt: skip
        session = onnxruntime.InferenceSession(
            program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        given = dict(zip(names, checked_on, strict=True))  # the exporter drops inputs a routing does not read
        outputs = session.run(None, {i.name: given[i.name].numpy() for i in session.get_inputs()})
        for part, ours, theirs in zip(OUTPUTS, expected, outputs, strict=True):
            case = f"the router exported to ONNX and run by ONNX Runtime, on a batch of 2 (traced on 3): the {part}"
            cause = f"{NOT_TRACEABLE}; or an operation ONNX computes otherwise than torch"
            _assert_close(torch.from_numpy(theirs), ours, case, cause, atol=1e-4, rtol=1e-4)

    def test_the_engagement_measures_are_defined(self) -> None:
        """The measures of whether it routes (capsexp.nn.functional.routing_engagement): the largest share in
        [1/J, 1], the KL from uniform at least 0 and finite, the decided share 0 or 1."""
        engagement = routing_engagement(self.route(self.layer(), *self.inputs()).assignment.detach())
        cause = "a child's assignment row all zeros, or not finite (its shares c_ij / sum_j c_ij are then undefined)"
        largest = engagement.largest
        assert (largest >= 1 / self.out_caps - 1e-6).all() and (largest <= 1 + 1e-6).all(), (  # a share: >= 1/J
            f"the largest share of a child's assignment from {largest.min():.3g} to {largest.max():.3g}, outside "
            f"[1/J, 1] = [{1 / self.out_caps:.3g}, 1]. Likely cause: {cause}"
        )
        kl = engagement.kl_from_uniform
        assert torch.isfinite(kl).all() and (kl >= 0).all(), (
            f"the KL from uniform not finite or below 0. Likely cause: {cause}"
        )
        assert set(engagement.decided.unique().tolist()) <= {0.0, 1.0}, (
            f"the decided share not 0 or 1. Likely cause: {cause}"
        )


def _jacobians(
    function: Callable[..., Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor], index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Autograd's and central finite differences' Jacobians of ``function``'s outputs (flattened, one
    after the other) with respect to ``inputs[index]``: (outputs, input elements), in the inputs' dtype."""
    inputs = [x.detach() for x in inputs]
    wanted = inputs[index].requires_grad_()
    with torch.enable_grad():
        outputs = torch.cat([y.reshape(-1) for y in function(*inputs)])
    autograds = torch.zeros(outputs.numel(), wanted.numel(), dtype=outputs.dtype)
    for row in range(outputs.numel()) if outputs.requires_grad else ():
        (gradient,) = torch.autograd.grad(outputs[row], wanted, retain_graph=True, allow_unused=True)
        if gradient is not None:
            autograds[row] = gradient.reshape(-1)
    numerical = torch.zeros_like(autograds)
    eps = 1e-6
    with torch.no_grad():
        for column in range(wanted.numel()):
            moved = []
            for step in (eps, -eps):
                shifted = [x.clone() for x in inputs]
                shifted[index].view(-1)[column] += step
                moved.append(torch.cat([y.reshape(-1) for y in function(*shifted)]))
            numerical[:, column] = (moved[0] - moved[1]) / (2 * eps)
    return autograds, numerical


def _gradcheck_summary(
    message: str, function: Callable[..., Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor]
) -> str:
    """gradcheck's failure in a few lines (its message prints both Jacobians whole): which output's
    gradient with respect to which input, and by how much it misses."""
    found = re.search(r"output (\d+) with respect to input (\d+)", message)
    if not found:
        return f"torch.autograd.gradcheck failed: {message.splitlines()[0][:300]}"
    # gradcheck numbers the inputs that require a gradient, the outputs all.
    output, index = int(found.group(1)), [i for i, x in enumerate(inputs) if x.requires_grad][int(found.group(2))]
    with torch.no_grad():
        sizes = [y.numel() for y in function(*inputs)]
    start = sum(sizes[:output])
    autograds, numerical = (j[start : start + sizes[output]] for j in _jacobians(function, inputs, index))
    difference = (autograds - numerical).abs()
    row, column = divmod(int(difference.argmax()), difference.shape[1])
    cause = (
        "a hand-written backward pass that is wrong, or a forward pass not differentiable there (a max, a sort, "
        "a clamp at its bound)"
    )
    if index == 0:
        cause += (
            "; or the couplings held constant in the backward pass (test_the_votes_get_gradient_through_the_couplings)"
        )
    return (
        f"the gradient of the {OUTPUTS[output]} with respect to the {INPUTS[index]} is not that of finite differences "
        f"(torch.autograd.gradcheck, float64, a layer of 4 children and 3 parents): it misses by up to "
        f"{difference.max():.3g} (autograd {autograds[row, column]:.4g}, finite differences "
        f"{numerical[row, column]:.4g}, where the gradient is up to {numerical.abs().max():.3g}). Likely cause: {cause}"
    )


class _Outputs(torch.nn.Module):
    """A router as a module of three tensors in, three out (what tracing and ONNX take)."""

    def __init__(self, router: torch.nn.Module) -> None:
        super().__init__()
        self.router = router

    def forward(
        self, votes: torch.Tensor, children: torch.Tensor, activations: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        return tuple(self.router(votes, children, activations))


def assert_page_rebuilds(page: Path, scratch: Path) -> None:
    """A results page (``python -m capsexp.compare ... --keep-runs``) as a reader checks it: its runs kept in
    ``page/runs`` copied into ``scratch`` and the page written again there from them alone, every file of the
    page (README, table, figures) the same bytes."""
    from capsexp.results.compare import compare

    shutil.copytree(page / "runs", scratch / "runs")
    compare(scratch / "runs", scratch)
    written = sorted(p.name for p in scratch.iterdir() if p.is_file())
    assert written == sorted(p.name for p in page.iterdir() if p.is_file())
    for file in written:
        assert (scratch / file).read_bytes() == (page / file).read_bytes(), file


def synthetic_digits(count: int, seed: int, size: int = 28) -> tuple[np.ndarray, np.ndarray]:
    """Easy, learnable "digits" as uint8 (count, size, size) and their labels: class k lights a 6x6 block at a
    place of its own, on noise."""
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % 10
    rng.shuffle(labels)
    images = rng.integers(0, 40, size=(count, size, size), dtype=np.uint8)
    for k in range(10):
        row, col = 3 + 7 * (k // 4), 3 + 7 * (k % 4)
        images[labels == k, row : row + 6, col : col + 6] = 220
    return images, labels.astype(np.uint8)


def write_synthetic_mnist(
    root: Path, train: int = 300, test: int = 100, gz: bool = True, folder: str = "MNIST"
) -> Path:
    """MNIST's four official IDX files (``root/<folder>/raw/``, torchvision's layout), holding
    :func:`synthetic_digits`: ``paths.data_dir=<root> data.verify_checksums=false`` reads them."""
    from capsexp.data.mnist import UNPACKED_MD5, write_idx

    raw = Path(root) / folder / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    data = {"train": synthetic_digits(train, seed=0), "t10k": synthetic_digits(test, seed=1)}
    for name in UNPACKED_MD5:
        images, labels = data[name.split("-")[0]]
        write_idx(raw / (name + (".gz" if gz else "")), images if "images" in name else labels)
    return Path(root)


def assert_trains(model: str, routing: str, scratch: Path, steps: int = 4, overrides: Sequence[str] = ()) -> Path:
    """``python -m capsexp model=<model> model/routing=<routing>`` run as a user runs it, in a new process in
    ``scratch``, on synthetic digits in MNIST's files, for ``steps`` steps, validated at the end: it must
    exit 0, build ``routing``'s router in the net, and log a finite training loss and a validation accuracy.
    Returns the run's folder (its checkpoints, events, card)."""
    from capsexp.records.events import read_scalars

    scratch = Path(scratch)
    data, run = write_synthetic_mnist(scratch / "data", train=200, test=40), scratch / "run"
    command = [
        sys.executable, "-m", "capsexp", f"model={model}", f"model/routing={routing}", "data=mnist",
        f"paths.data_dir={data}", "data.verify_checksums=false", "data.batch_size=16", "data.val_size=32",
        f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}", "trainer.accelerator=cpu",
        "trainer.log_every_n_steps=1", "test=false", "callbacks.progress_bar=null", f"hydra.run.dir={run}",
        *overrides,
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=scratch, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"}
    )
    shown = " ".join(command[1:])
    assert done.returncode == 0, f"python {shown} exited {done.returncode}:\n{done.stderr[-3000:]}"
    assert f"model/routing={routing}" in (run / ".hydra" / "overrides.yaml").read_text(), f"{shown}: not recorded"
    _assert_logged_training(read_scalars(run), shown)
    return run


def _assert_logged_training(series: dict, shown: str) -> None:
    """Every logged training loss finite (a loss that turns NaN after its first steps fails), and a
    validation accuracy logged."""
    losses = [value for _, value in series.get("train/loss_step", [])]
    assert losses and all(math.isfinite(v) for v in losses), f"{shown}: the training loss {losses}"
    assert "val/acc" in series, f"{shown}: no val/acc logged (tags: {sorted(series)})"
