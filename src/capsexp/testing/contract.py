"""The routing contract: :class:`RoutingContract`, whose ``test_*`` methods pytest collects for a
routing's test class (:mod:`capsexp.testing` says what each checks and how a routing opts out of one)."""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.autograd.gradcheck import GradcheckError

from capsexp.nn import RoutingCapsules
from capsexp.nn.functional import Routed, coupled, routing_engagement
from capsexp.testing.gradients import OUTPUTS, gradcheck_summary, jacobians

# Votes of each kind a layer meets: (name, a function of random votes of unit scale).
EXTREME_VOTES: tuple[tuple[str, Callable[[torch.Tensor], torch.Tensor]], ...] = (
    ("tiny", lambda votes: votes * 1e-8),
    ("huge", lambda votes: votes * 1e4),
    ("identical for every child", lambda votes: votes[:, :1].expand_as(votes).clone()),
    ("zero", torch.zeros_like),
)


Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # votes, children, child activations

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
            raise AssertionError(gradcheck_summary(str(error), routed, inputs)) from None

    def test_the_votes_get_gradient_through_the_couplings(self) -> None:
        """The gradient of the parents' poses and activations with respect to the votes, by autograd, is
        that of finite differences (float64, a small layer): the couplings, computed from the votes, pass
        their share of it back to them. Under ``gradient_through_couplings = False`` the votes' gradient is
        there and finite, and differs from finite differences (the declaration is true)."""
        layer = self.layer(torch.float64, small=True)
        votes, children, activations = self.inputs(torch.float64, small=True)

        def parents(votes: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(self.route(layer, votes, children, activations))[:2]

        autograds, numerical = jacobians(parents, (votes,), 0)
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

        autograds, numerical = jacobians(assignment, (votes,), 0)
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

    def test_parents_declared_as_eq1s_are_made_so_from_the_assignment(self) -> None:
        """Where the options declare ``coupled_parents``: the parents are Eq. 1's of the assignment returned,
        v_j = squash(sum_i c_ij u_hat_j|i) with |v_j| the activation, as the shuffled control makes its own
        (a verdict then reads that control as a change of the couplings alone)."""
        if not getattr(self.routing, "coupled_parents", False):
            pytest.skip(
                f"{type(self.routing).__name__} declares coupled_parents = False: its parents are made otherwise"
            )
        votes, children, activations = self.inputs()
        routed = self.route(self.layer(), votes, children, activations)
        eq1 = coupled(votes, routed.assignment)
        cause = (
            "parents made otherwise than squash(sum_i c_ij u_hat_j|i) of the assignment returned (the couplings "
            "of another iteration returned, a bias added, or another squash): declare coupled_parents = False"
        )
        _assert_close(
            routed.poses, eq1.poses, "the poses against Eq. 1's of the assignment", cause, atol=1e-5, rtol=1e-4
        )
        _assert_close(routed.activations, eq1.activations, "the activations against |v_j|", cause, atol=1e-5, rtol=1e-4)

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


class _Outputs(torch.nn.Module):
    """A router as a module of three tensors in, three out (what tracing and ONNX take)."""

    def __init__(self, router: torch.nn.Module) -> None:
        super().__init__()
        self.router = router

    def forward(
        self, votes: torch.Tensor, children: torch.Tensor, activations: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        return tuple(self.router(votes, children, activations))
