"""The checks every routing algorithm should pass, for a routing's author to run from their own tests:

    from capsexp.testing import RoutingContract

    class TestMyRouting(RoutingContract):
        routing = MyRouting(iterations=3)

pytest collects the ``test_*`` methods below for that class. Each routes random votes through the router
a fully connected capsule layer builds for ``routing`` (:class:`capsexp.nn.RoutingCapsules`: I children
of ``in_dim`` dimensions, J parents of ``out_dim``), called as every router is,

    router(votes (B, I, J, D), children (B, I, in_dim), child_activations (B, I)) -> Routed

and checks one convention of the capsule literature (docs/own_routing.md says where each comes from). A
method that legitimately differs says so by a class attribute, with its reason in the docs:

- ``assignment_sums_to_one`` (True): each child's assignment over the parents sums to 1 (Sabour et al.
  2017's couplings, a softmax over parents; EM's responsibilities). False for a method whose couplings
  are bounded one by one instead (a "none of the above" parent takes a share; max-min normalisation maps
  each onto its bounds);
- ``children_interchangeable`` (True): the children's order does not matter. False for a router with
  learned parameters of its own per child (self routing's routing weights, efficient routing's priors);
- ``draws`` (False): True for a method that draws at random at every call (random couplings): the checks
  that compare two calls compare them under the same seed, and those that cannot (the children's or the
  batch's order, float32 against float64, export) are not run;
- ``float64_tolerance`` (1e-3): how far float32 may be from float64 on ill-conditioned votes.

The sizes are unequal (I=7 children of 5 dimensions, J=4 parents of 6, batch 3), so that a transposed axis
does not go unnoticed.

For a study's results page, :func:`assert_page_rebuilds` checks that its kept runs write it again, byte for
byte.
"""

from __future__ import annotations

import contextlib
import io
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

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


class RoutingContract:
    """Subclass with ``routing`` set to a routing's options (see the module docstring)."""

    routing: Any = None
    assignment_sums_to_one: bool = True
    children_interchangeable: bool = True
    draws: bool = False
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
        assert routed.poses.shape == (self.batch, self.out_caps, self.out_dim), routed.poses.shape
        assert routed.activations.shape == (self.batch, self.out_caps), routed.activations.shape
        assert ((routed.activations >= 0) & (routed.activations <= 1)).all(), "activations outside [0, 1]"
        assert routed.assignment is not None, "the router keeps no assignment (return it in Routed)"
        assert routed.assignment.shape == (self.batch, self.in_caps, self.out_caps), routed.assignment.shape
        assert ((routed.assignment >= 0) & (routed.assignment <= 1 + 1e-6)).all(), "assignment outside [0, 1]"

    def test_each_childs_assignment_sums_to_one(self) -> None:
        """Sum over parents j of c_ij = 1 for every child i, where the method says so (each weight in [0, 1]
        is checked by :meth:`test_shapes_and_ranges` either way)."""
        if not self.assignment_sums_to_one:
            return
        sums = self.route(self.layer(), *self.inputs()).assignment.sum(dim=-1)
        torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-5, rtol=0)

    def test_the_order_of_the_children_does_not_matter(self) -> None:
        """Children permuted: the same parents, each child's assignment moved with it."""
        if not self.children_interchangeable or self.draws:
            return
        layer, (votes, children, activations) = self.layer(), self.inputs()
        order = torch.tensor([3, 0, 6, 1, 5, 2, 4][: self.in_caps])
        routed = self.route(layer, votes, children, activations)
        permuted = self.route(layer, votes[:, order], children[:, order], activations[:, order])
        torch.testing.assert_close(permuted.poses, routed.poses, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(permuted.activations, routed.activations, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(permuted.assignment, routed.assignment[:, order], atol=1e-5, rtol=1e-4)

    def test_each_image_is_routed_on_its_own(self) -> None:
        """In evaluation, an image's parents do not depend on the other images of its batch, nor on its place."""
        if self.draws:
            return
        layer, (votes, children, activations) = self.layer(), self.inputs()
        routed = self.route(layer, votes, children, activations)
        order = torch.tensor([2, 0, 1])
        permuted = self.route(layer, votes[order], children[order], activations[order])
        alone = self.route(layer, votes[1:2], children[1:2], activations[1:2])
        for other, index in ((permuted, order), (alone, torch.tensor([1]))):
            torch.testing.assert_close(other.poses, routed.poses[index], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(other.activations, routed.activations[index], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(other.assignment, routed.assignment[index], atol=1e-5, rtol=1e-4)

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
            for part, value in zip(("poses", "activations", "assignment"), routed, strict=True):
                assert torch.isfinite(value).all(), f"{name} votes: {part} not finite"
            (routed.poses.square().sum() + routed.activations.sum() + routed.assignment.square().sum()).backward()
            gradients = {"votes": votes.grad, "children": children.grad, "activations": activations.grad}
            gradients.update({n: p.grad for n, p in layer.router.named_parameters()})
            for part, gradient in gradients.items():
                assert gradient is None or torch.isfinite(gradient).all(), f"{name} votes: {part} gradient not finite"

    def test_float32_stays_close_to_float64_on_ill_conditioned_votes(self) -> None:
        """Votes that nearly agree far from the origin (an offset of 20, a spread of 0.03): float32 within
        ``float64_tolerance`` of float64 in activations and assignment, relative to the poses' scale."""
        if self.draws:  # float32 and float64 draws differ
            return
        votes, children, activations = self.inputs(torch.float64)
        votes = 20.0 + 0.03 * votes
        exact = self.route(self.layer(torch.float64), votes, children, activations)
        single = self.route(self.layer(torch.float32), votes.float(), children.float(), activations.float())
        tolerance = self.float64_tolerance
        assert (single.activations.double() - exact.activations).abs().max() <= tolerance
        assert (single.assignment.double() - exact.assignment).abs().max() <= tolerance
        scale = exact.poses.abs().max().clamp_min(1.0)
        assert (single.poses.double() - exact.poses).abs().max() <= tolerance * scale

    def test_gradients_are_autograds_numerical_ones(self) -> None:
        """torch.autograd.gradcheck in float64 on a small layer: the votes' and children's gradients of the
        parents and the assignment match finite differences (a hand-written backward pass must be right)."""
        layer = self.layer(torch.float64, small=True)
        votes, children, activations = (x.requires_grad_() for x in self.inputs(torch.float64, small=True))

        def routed(votes: torch.Tensor, children: torch.Tensor, activations: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(self.route(layer, votes, children, activations))

        assert torch.autograd.gradcheck(routed, (votes, children, activations), eps=1e-6, atol=1e-5, rtol=1e-3)

    def test_the_same_seed_draws_the_same(self) -> None:
        """Two calls under one seed give the same parents; a routing that draws gives others under another."""
        layer, inputs = self.layer(), self.inputs()
        draws = []
        for seed in (5, 5, 6):
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                draws.append(layer.router(*inputs))
        torch.testing.assert_close(draws[0].poses, draws[1].poses, atol=0, rtol=0)
        if self.draws:
            assert not torch.equal(draws[0].assignment, draws[2].assignment), "another seed drew the same"

    def test_torchscript_gives_its_outputs(self) -> None:
        """The router traced by TorchScript gives its outputs on inputs other than the traced ones."""
        if self.draws:
            return
        layer = self.layer()
        expected = self.route(layer, *self.inputs(seed=3))
        with torch.no_grad():
            traced = torch.jit.trace(_Outputs(layer.router), self.inputs(seed=1), check_trace=False)
            for ours, theirs in zip(expected, traced(*self.inputs(seed=3)), strict=True):
                torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)

    def test_onnx_gives_its_outputs(self) -> None:
        """The router exported to ONNX as ``python -m capsexp.export format=onnx`` exports (torch.export, a
        dynamic batch) and run by ONNX Runtime gives its outputs on another batch size than the traced one.
        Skipped where ONNX Runtime or the exporter is not installed (``pip install 'capsexp[export]'``)."""
        if self.draws:
            return
        try:
            import onnxruntime
            import onnxscript  # noqa: F401  (torch.onnx's exporter)
        except ImportError:
            return
        from capsexp.use.export import OPSET

        layer = self.layer()
        traced_on, checked_on = self.inputs(seed=1), tuple(x[:2] for x in self.inputs(seed=3))
        expected = self.route(layer, *checked_on)
        batch = torch.export.Dim("batch")
        names = ["votes", "children", "activations"]
        with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
            program = torch.onnx.export(
                _Outputs(layer.router), traced_on, dynamo=True, input_names=names, opset_version=OPSET,
                dynamic_shapes=tuple({0: batch} for _ in names), verbose=False,
            )  # fmt: skip
        session = onnxruntime.InferenceSession(
            program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        given = dict(zip(names, checked_on, strict=True))  # the exporter drops inputs a routing does not read
        outputs = session.run(None, {i.name: given[i.name].numpy() for i in session.get_inputs()})
        for ours, theirs in zip(expected, outputs, strict=True):
            torch.testing.assert_close(torch.from_numpy(theirs), ours, atol=1e-4, rtol=1e-4)

    def test_the_engagement_measures_are_defined(self) -> None:
        """The measures of whether it routes (capsexp.nn.functional.routing_engagement): the largest share in
        [1/J, 1], the KL from uniform at least 0 and finite, the decided share 0 or 1."""
        engagement = routing_engagement(self.route(self.layer(), *self.inputs()).assignment.detach())
        assert (engagement.largest >= 1 / self.out_caps - 1e-6).all()  # a share: at least uniform's 1/J
        assert (engagement.largest <= 1 + 1e-6).all()
        assert torch.isfinite(engagement.kl_from_uniform).all() and (engagement.kl_from_uniform >= 0).all()
        assert set(engagement.decided.unique().tolist()) <= {0.0, 1.0}


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
