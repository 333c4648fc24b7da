"""Routing as a swappable part of a capsule layer: one module per algorithm, holding the algorithm's
options and its learned parameters, all called alike,

    router(votes (B, I, J, D), children (B, I, in_dim), child_activations (B, I)) -> Routed

and returning the parents' poses, activations in [0, 1] and the assignment (couplings,
responsibilities), so that a forward hook sees what any algorithm did. :func:`make_router` builds the
one the options name. A router may offer a path fused with the layer's votes (``fused_with_votes``:
dynamic routing's, which keeps no couplings); :class:`~capsexp.nn.RoutingCapsules` takes it, and calls the
router's module as well only while someone watches the router (:func:`watch`, :func:`watched`), so that the
watcher sees the couplings. The matrix-capsule layers call the same routers on flattened 4 x 4 poses, window
by window (:class:`~capsexp.nn.WindowRouter`; what each layer hands them: :class:`~capsexp.nn.Routing`).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from capsexp.config.routing_options import (
    AttentionRouting,
    DynamicRouting,
    EfficientRouting,
    EMRouting,
    RoutingOptions,
    SelfRouting,
    VBRouting,
)
from capsexp.nn.functional import (
    Routed,
    attention_routing,
    dynamic_routing,
    efficient_routing,
    em_routing,
    exporting,
    fully_connected_routing,
    random_routing,
    self_routing,
    shuffled_couplings,
    sinkhorn_routing,
    uniform_routing,
    vb_routing,
)

# What a class capsule's activation is called where it is a net's class score (capsexp.use.inference's
# score_kind): a router declares its own in ``score_kind``; one that declares none gives this.
CLASS_CAPSULE_ACTIVATION = "class capsule activation"


class _Router(nn.Module):
    score_kind = CLASS_CAPSULE_ACTIVATION
    # A path fused with the layer's votes, ``fused_with_votes(children, weight, out_caps) -> Routed | None``
    # (DynamicRouter's); None: the router has none, and the layer makes the votes and calls the router.
    fused_with_votes: Callable[[torch.Tensor, Callable[[], torch.Tensor], int], Routed | None] | None = None

    def __init__(self, routing: RoutingOptions) -> None:
        super().__init__()
        self.routing = routing

    def extra_repr(self) -> str:
        return repr(self.routing)


class DynamicRouter(_Router):
    """Procedure 1 of Sabour et al. 2017 (:func:`~capsexp.nn.functional.dynamic_routing`); activation |v_j|.
    With ``bias`` (a value), a learned bias b_j (J, D), initialised to it, is added to every iteration's s_j,
    as the official code does."""

    score_kind = "capsule length"

    def __init__(self, routing: DynamicRouting, out_caps: int = 1, out_dim: int = 1, bias: float | None = None) -> None:
        super().__init__(routing)
        self.bias = None if bias is None else nn.Parameter(torch.full((out_caps, out_dim), float(bias)))

    def forward(self, votes: torch.Tensor, children: torch.Tensor, child_activations: torch.Tensor) -> Routed:
        poses, couplings = dynamic_routing(votes, self.routing, return_couplings=True, bias=self.bias)
        return Routed(poses, torch.linalg.vector_norm(poses, dim=-1), couplings)

    def fused_with_votes(
        self, children: torch.Tensor, weight: Callable[[], torch.Tensor], out_caps: int
    ) -> Routed | None:
        """The parents routed from ``children`` (B, I, in_dim) in one pass with their votes W_ij u_i, without
        the couplings: :func:`~capsexp.nn.functional.fully_connected_routing`, the same parents as routing
        the votes, with the vote matmul fused into the backward pass. ``weight`` gives W, (I, in_dim,
        out_caps * D) as :class:`~capsexp.nn.RoutingCapsules` stores it. None while a graph is captured for
        export: the exporters trace the plain path."""
        if exporting():
            return None
        poses = fully_connected_routing(children, weight(), out_caps, self.routing, self.bias)
        return Routed(poses, torch.linalg.vector_norm(poses, dim=-1), None)


# The variance floor of routing.sigma_eps=None in CapsNet's place (capsexp.nn.EMRouting): DigitCaps' votes
# (W_ij of std 0.01) start with variances near 1e-4, which the matrix layers' floor of 0.01 would hide.
VECTOR_FLOOR = 1e-4


class EMVectorRouter(_Router):
    """EM routing (Hinton et al. 2018, :func:`~capsexp.nn.functional.em_routing`) on vector poses: every
    pose element one Gaussian dimension, beta_u and beta_a learned per parent, and the learned factor on
    the inverse temperatures where the options ask for it."""

    def __init__(self, routing: EMRouting, out_caps: int) -> None:
        if routing.sigma_eps is None:
            routing = dataclasses.replace(routing, sigma_eps=VECTOR_FLOOR)
        super().__init__(routing)
        self.beta_u = nn.Parameter(torch.zeros(out_caps))
        self.beta_a = nn.Parameter(torch.zeros(out_caps))
        self.log_inverse_temperature = nn.Parameter(torch.zeros(())) if routing.learn_inverse_temperature else None

    def forward(self, votes: torch.Tensor, children: torch.Tensor, child_activations: torch.Tensor) -> Routed:
        scale = None if self.log_inverse_temperature is None else self.log_inverse_temperature.exp()
        poses, activations, responsibilities = em_routing(
            votes,
            child_activations,
            self.beta_u,
            self.beta_a,
            self.routing,
            return_responsibilities=True,
            inverse_temperature_scale=scale,
        )
        return Routed(poses, activations, responsibilities)


class SelfRouter(_Router):
    """Self-routing (Hahn et al. 2019, :func:`~capsexp.nn.functional.self_routing`): child i's routing
    logits W^route_i u_i + b^route_i over the parents, W^route and b^route starting at 0 (uniform
    couplings), as coder3000/SR-CapsNet initialises them."""

    def __init__(self, routing: SelfRouting, in_caps: int, in_dim: int, out_caps: int) -> None:
        super().__init__(routing)
        self.weight = nn.Parameter(torch.zeros(in_caps, in_dim, out_caps))
        self.bias = nn.Parameter(torch.zeros(in_caps, out_caps))

    def forward(self, votes: torch.Tensor, children: torch.Tensor, child_activations: torch.Tensor) -> Routed:
        logits = torch.einsum("bik,ikj->bij", children, self.weight) + self.bias
        return self_routing(votes, child_activations, logits)


class AttentionRouter(_Router):
    """Inverted dot-product attention routing (Tsai et al. 2020, :func:`~capsexp.nn.functional.attention_routing`):
    the parents' LayerNorm (affine, from the identity) and the class logit's linear map shared by the
    parents (``nn.Linear(D, 1)``'s initialisation), as the paper's model has them."""

    def __init__(self, routing: AttentionRouting, out_dim: int) -> None:
        super().__init__(routing)
        self.norm = nn.LayerNorm(out_dim)
        self.score = nn.Linear(out_dim, 1)

    def forward(self, votes: torch.Tensor, children: torch.Tensor, child_activations: torch.Tensor) -> Routed:
        return attention_routing(
            votes, self.routing.iterations, self.norm.weight, self.norm.bias, self.score.weight[0], self.score.bias[0]
        )


class EfficientRouter(_Router):
    """Efficient-CapsNet's self-attention routing (Mazzia et al. 2021,
    :func:`~capsexp.nn.functional.efficient_routing`), its log priors b (I, J) starting at 0, as its code
    initialises them."""

    def __init__(self, routing: EfficientRouting, in_caps: int, out_caps: int) -> None:
        super().__init__(routing)
        self.log_priors = nn.Parameter(torch.zeros(in_caps, out_caps))

    def forward(self, votes: torch.Tensor, children: torch.Tensor, child_activations: torch.Tensor) -> Routed:
        return efficient_routing(votes, self.log_priors)


class VBRouter(_Router):
    """Variational Bayes routing (Ribeiro et al. 2020, :func:`~capsexp.nn.functional.vb_routing`) on vector
    poses, as the authors' class-capsule layer has it: beta_u and beta_a learned per parent (from 0), the
    posterior mean poses batch-normalised per parent, the activations sigmoid(batch norm of the logits), both
    normalisations without learned scale or shift."""

    def __init__(self, routing: VBRouting, out_caps: int) -> None:
        super().__init__(routing)
        self.beta_u = nn.Parameter(torch.zeros(out_caps))
        self.beta_a = nn.Parameter(torch.zeros(out_caps))
        self.pose_norm = nn.BatchNorm1d(out_caps, affine=False)
        self.activation_norm = nn.BatchNorm1d(out_caps, affine=False)

    def forward(self, votes: torch.Tensor, children: torch.Tensor, child_activations: torch.Tensor) -> Routed:
        routed = vb_routing(votes, child_activations, self.beta_u, self.beta_a, self.routing)
        poses = self.pose_norm(routed.poses).to(votes.dtype)
        activations = torch.sigmoid(self.activation_norm(routed.activation_logits)).to(votes.dtype)
        return Routed(poses, activations, routed.responsibilities)


class SinkhornRouter(_Router):
    """Routing as optimal transport (:func:`~capsexp.nn.functional.sinkhorn_routing`): the children's
    activations are the masses each spreads over the parents, every parent receiving the same share."""

    def forward(self, votes: torch.Tensor, children: torch.Tensor, child_activations: torch.Tensor) -> Routed:
        return sinkhorn_routing(votes, child_activations, self.routing)


class UniformRouter(_Router):
    """Every coupling 1/J (:func:`~capsexp.nn.functional.uniform_routing`)."""

    def forward(self, votes: torch.Tensor, children: torch.Tensor, child_activations: torch.Tensor) -> Routed:
        return uniform_routing(votes)


class RandomRouter(_Router):
    """Random couplings at every pass (:func:`~capsexp.nn.functional.random_routing`), from torch's global
    generator (so ``seed=`` fixes them)."""

    def forward(self, votes: torch.Tensor, children: torch.Tensor, child_activations: torch.Tensor) -> Routed:
        return random_routing(votes)


class ShuffledCouplings(nn.Module):
    """A control for whether a routing's couplings depend on the image: ``router``'s own assignment for each
    image given to another image of the batch (:func:`~capsexp.nn.functional.shuffled_couplings`: the same
    values, the wrong image), the parents then made of it as uniform and random coupling make theirs. For
    dynamic routing, whose parents are made so, that is the one change; for another algorithm its own
    step from couplings to parents is replaced too. The router's parameters train through the couplings."""

    score_kind = "capsule length"

    def __init__(self, router: nn.Module) -> None:
        super().__init__()
        self.router = router

    @property
    def routing(self) -> RoutingOptions:
        return self.router.routing

    @routing.setter
    def routing(self, options: RoutingOptions) -> None:  # routed_by_iteration sets it for each iteration count
        self.router.routing = options

    @property
    def bias(self) -> torch.Tensor | None:
        return getattr(self.router, "bias", None)

    def forward(self, votes: torch.Tensor, children: torch.Tensor, child_activations: torch.Tensor) -> Routed:
        own = self.router(votes, children, child_activations)
        if own.assignment is None:
            raise ValueError(f"{type(self.router).__name__} returned no assignment to shuffle")
        return shuffled_couplings(votes, own.assignment)


def make_router(
    routing: RoutingOptions,
    in_caps: int | None,
    in_dim: int,
    out_caps: int,
    out_dim: int,
    bias: float | None = None,
) -> nn.Module:
    """The router the options ``routing`` name (:class:`~capsexp.config.routing_options.Routing`: built in,
    or a plugin's), for I = ``in_caps`` children of ``in_dim`` dimensions and J = ``out_caps`` parents of
    ``out_dim``: a router class built with the options and the sizes its constructor names, or a function
    wrapped in :class:`FunctionRouter`. ``bias``: dynamic routing's official bias, refused by a router
    that takes none. A size given as None (a layer that does not know it yet) is refused by a router
    whose constructor names it."""
    target = type(routing).router
    if not target:
        raise TypeError(f"{type(routing).__name__} names no router (its class attribute router = 'module:name')")
    router = named(target)
    accepted = inspect.signature(router).parameters if inspect.isclass(router) else {}  # a function takes no size
    if bias is not None and "bias" not in accepted:
        raise ValueError(
            f"bias={bias}: the official routing bias is dynamic routing's; {type(routing).__name__} has none"
        )
    if not inspect.isclass(router):
        return FunctionRouter(routing, router)
    sizes = {"in_caps": in_caps, "in_dim": in_dim, "out_caps": out_caps, "out_dim": out_dim, "bias": bias}
    if unknown := [
        key for key in ("in_caps", "in_dim", "out_caps", "out_dim") if key in accepted and sizes[key] is None
    ]:
        raise ValueError(f"{target} needs {' and '.join(unknown)}, which this layer was not given")
    return router(routing, **{key: value for key, value in sizes.items() if key in accepted})


def named(target: str):
    """What ``"module:name"`` names (a router class or function), imported now."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


class FunctionRouter(_Router):
    """A routing given as a function ``(votes (B, I, J, D), options) -> Routed``, without learned parameters."""

    def __init__(self, routing: RoutingOptions, function) -> None:
        super().__init__(routing)
        self.function = function

    def forward(self, votes: torch.Tensor, children: torch.Tensor, child_activations: torch.Tensor) -> Routed:
        return self.function(votes, self.routing)


@torch.no_grad()
def routed_by_iteration(
    router: nn.Module, votes: torch.Tensor, children: torch.Tensor, child_activations: torch.Tensor
) -> list[Routed]:
    """What ``router`` gives after 1, 2, ..., R iterations of its algorithm on the same inputs (R: its
    options' ``iterations``; one entry for an algorithm that does not iterate), without gradient: how
    its parents and assignment settle. Each entry is the algorithm run afresh with fewer iterations,
    which for a deterministic algorithm is its state after that iteration."""
    final = router.routing
    if not isinstance(getattr(final, "iterations", None), int):
        return [router(votes, children, child_activations)]
    try:
        routed = []
        for iterations in range(1, final.iterations + 1):
            router.routing = dataclasses.replace(final, iterations=iterations)
            routed.append(router(votes, children, child_activations))
        return routed
    finally:
        router.routing = final


class Watch:
    """A watch on a router (:func:`watch`), ended by :meth:`remove` or at the end of a ``with`` block."""

    def __init__(self, router: nn.Module, handle: RemovableHandle) -> None:
        self.router, self.handle = router, handle

    def remove(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
            self.router._watchers -= 1

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exception) -> None:
        self.remove()


def watch(router: nn.Module, hook: Callable, with_kwargs: bool = False) -> Watch:
    """Show ``hook``, a forward hook of ``router`` (``register_forward_hook``'s, with its ``with_kwargs``),
    every routing the router does, assignment included: while watched, a layer that routes by a fused path
    without the assignment (:meth:`_Router.fused_with_votes`) also calls the router. A hook registered
    on the router otherwise sees only the calls the layer makes anyway."""
    handle = router.register_forward_hook(hook, with_kwargs=with_kwargs)
    router._watchers = getattr(router, "_watchers", 0) + 1  # the watches under way, counted on the router
    return Watch(router, handle)


def watched(router: nn.Module) -> bool:
    """Whether someone watches ``router`` (:func:`watch`): a layer then shows it the assignment."""
    return getattr(router, "_watchers", 0) > 0
