"""Vector-capsule layers, CapsNet's (Sabour et al. 2017, section 4): PrimaryCaps, and the fully connected
class capsules routed by any router of :mod:`capsexp.nn.routers`."""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
from pydantic import PositiveInt
from torch import nn

from capsexp.config.routing_options import DynamicRouting, RoutingOptions
from capsexp.nn.functional import Routed, RoutingTrace, dynamic_routing_trace, squash
from capsexp.nn.routers import (
    CLASS_CAPSULE_ACTIVATION,
    ShuffledCouplings,
    make_router,
    routed_by_iteration,
    watched,
)

# Whose couplings route each image: its own, or another image's (the control for input dependence).
Couplings = Literal["own", "shuffled"]


class PrimaryCapsules(nn.Module):
    """PrimaryCaps: a convolution whose output channels form ``num_types`` capsule types of ``dim`` dims.

    The paper: 32 channels of convolutional 8D capsules, 9x9 kernel, stride 2. Output channel
    ``t * dim + d`` is dimension d of capsule type t: the 256 channels group as 32 types x 8 dims
    (not 8 x 32), and every spatial position of every type is one capsule. Output: (B, num_types * H' * W',
    dim), type-major, each vector squashed (Eq. 1).

    ``bias`` (a value): the official code's layer (``conv_slim_capsule`` with one input capsule and one
    routing iteration): the convolution has no bias of its own; its output is weighted by that routing's
    coupling, 1/num_types (a softmax over the types of one zero logit each), and a learned bias per type
    and dimension, initialised to ``bias``, is added before the squash. None: a plain convolution with bias.
    """

    def __init__(
        self,
        in_channels: int = 256,
        num_types: int = 32,
        dim: int = 8,
        kernel_size: int = 9,
        stride: int = 2,
        bias: float | None = None,
    ) -> None:
        super().__init__()
        self.num_types, self.dim = num_types, dim
        self.conv = nn.Conv2d(in_channels, num_types * dim, kernel_size=kernel_size, stride=stride, bias=bias is None)
        self.bias = None if bias is None else nn.Parameter(torch.full((num_types, 1, 1, dim), float(bias)))

    def output_size(self, height: int, width: int) -> int:
        """Number of capsules for an input feature map of the given size."""
        kernel, stride = self.conv.kernel_size, self.conv.stride
        return self.num_types * ((height - kernel[0]) // stride[0] + 1) * ((width - kernel[1]) // stride[1] + 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        out = self.conv(features)
        batch, _, height, width = out.shape
        capsules = out.view(batch, self.num_types, self.dim, height, width).permute(0, 1, 3, 4, 2)
        if self.bias is not None:  # the official layer: one routing iteration's coupling, then its bias
            capsules = capsules / self.num_types + self.bias
        return squash(capsules.reshape(batch, self.num_types * height * width, self.dim))


def _lengths(capsules: torch.Tensor) -> torch.Tensor:
    """|u|: a squashed capsule's activation. vector_norm's gradient at a zero vector is 0, not NaN."""
    return torch.linalg.vector_norm(capsules, dim=-1)


# W_ij's std at initialisation (the official code's is 0.1: capsexp.models.capsnet.OFFICIAL_STD).
INIT_STD = 0.01


class RoutingCapsules(nn.Module):
    """A fully connected capsule layer (DigitCaps), routed by the algorithm ``routing`` names.

    One ``out_dim x in_dim`` matrix W_ij per (input capsule i, output capsule j); votes
    u_hat_j|i = W_ij u_i (section 2), then the routing (:mod:`capsexp.nn.routers`), given the children's
    activations |u_i| where it uses them (the inputs are squashed capsules). A router that offers a path
    fused with the votes (``router.fused_with_votes``: dynamic routing's,
    :func:`~capsexp.nn.functional.fully_connected_routing`) routes by it, without its couplings; while
    someone watches the router (:func:`capsexp.nn.routers.watch`), the router also runs (without gradient)
    so that the watcher sees them. No bias by default, as in the paper's parameter count; ``bias`` (a value, with
    dynamic routing): a learned bias per parent dimension, initialised to it and added to s_j in every
    routing iteration, as the official code's ``capsule`` layer does (``router.bias``). ``init_std``: W_ij
    drawn from N(0, init_std^2), truncated at two standard deviations with ``truncated_init`` (TensorFlow's
    ``truncated_normal``, the official code's). ``child_types`` T (a number): the children are T types of I/T
    positions each, type-major (PrimaryCaps' order), and one W_tj per child type t and parent j serves every
    position (I/T times fewer matrices): Gu & Tresp 2020's transformation shared by the children of a parent,
    which makes each vote independent of where its child sits. None: one W_ij per child (the paper).
    ``couplings``: ``own`` (the routing's), or ``shuffled``, the control for whether they depend on the
    image (:class:`~capsexp.nn.routers.ShuffledCouplings`: each image routed by another image's couplings).
    """

    def __init__(
        self,
        in_caps: int,
        in_dim: int,
        out_caps: int,
        out_dim: int,
        routing: RoutingOptions = DynamicRouting(),
        init_std: float = INIT_STD,
        bias: float | None = None,
        truncated_init: bool = False,
        child_types: PositiveInt | None = None,
        couplings: Couplings = "own",
    ) -> None:
        super().__init__()
        if child_types is not None and in_caps % child_types:
            raise ValueError(f"child_types={child_types} does not divide the {in_caps} input capsules")
        self.in_caps, self.in_dim, self.out_caps, self.out_dim = in_caps, in_dim, out_caps, out_dim
        self.child_types = child_types
        self.routing = routing
        self.router = make_router(routing, in_caps, in_dim, out_caps, out_dim, bias)
        if couplings == "shuffled":
            self.router = ShuffledCouplings(self.router)
        # Stored (I, in_dim, J * out_dim): the votes are then one batched matmul over the inputs i.
        shape = (child_types or in_caps, in_dim, out_caps * out_dim)
        if truncated_init:
            weight = nn.init.trunc_normal_(torch.empty(shape), std=init_std, a=-2 * init_std, b=2 * init_std)
        else:
            weight = torch.randn(shape) * init_std
        self.weight = nn.Parameter(weight)

    @property
    def score_kind(self) -> str:
        """What its activations are called where they are a net's class scores: as its router declares
        (``router.score_kind``: a capsule length for dynamic routing's), a class capsule activation where it
        declares nothing."""
        return getattr(self.router, "score_kind", CLASS_CAPSULE_ACTIVATION)

    def transform(self) -> torch.Tensor:
        """Every child's W_ij, (I, in_dim, J * out_dim): the weight itself, or with ``child_types`` each
        type's matrices repeated over its positions (their gradients summed back by autograd)."""
        if self.child_types is None:
            return self.weight
        return self.weight.repeat_interleave(self.in_caps // self.child_types, dim=0)

    def votes(self, inputs: torch.Tensor) -> torch.Tensor:
        """u_hat_j|i = W_ij u_i for inputs (B, I, in_dim): shape (B, I, J, D), stored parent-major.

        One bmm over the input capsules, (I, B, in_dim) @ (I, in_dim, J*D): W is never copied over
        the batch. The result is then laid out as (B, J, I, D), where routing reads each
        (example, parent) as one contiguous I x D matrix, and returned as a (B, I, J, D) view.
        """
        batch = inputs.shape[0]
        # In float32 at least under autocast too, as the fused path (fully_connected_routing): routing reads
        # the votes in its float32 sums, and bf16 ones took the CPU's slow batched matrix-vector paths.
        transform = self.transform()
        dtype = torch.promote_types(torch.result_type(inputs, transform), torch.float32)
        with torch.autocast(device_type=inputs.device.type, enabled=False):
            votes = torch.bmm(inputs.transpose(0, 1).to(dtype), transform.to(dtype))  # (I, B, J*D)
        votes = votes.view(self.in_caps, batch, self.out_caps, self.out_dim)
        return votes.permute(1, 2, 0, 3).contiguous().transpose(1, 2)  # (B, I, J, D)

    def forward(self, inputs: torch.Tensor) -> Routed:
        """The parents routed from input capsules (B, I, in_dim); the assignment is None where the router's
        fused path runs."""
        if inputs.shape[1:] != (self.in_caps, self.in_dim):
            raise ValueError(
                f"expected input capsules of shape (B, {self.in_caps}, {self.in_dim}), got {tuple(inputs.shape)}"
            )
        fused = getattr(self.router, "fused_with_votes", None)  # None (or a plugin's router): no fused path
        routed = None if fused is None else fused(inputs, self.transform, self.out_caps)
        if routed is None:
            return self.router(self.votes(inputs), inputs, _lengths(inputs))
        if watched(self.router):  # the fused path keeps no assignment: the router shows it to the watcher
            with torch.no_grad():
                self.router(self.votes(inputs), inputs, _lengths(inputs))
        return routed

    def routed_by_iteration(self, inputs: torch.Tensor) -> list[Routed]:
        """The parents and assignment after each iteration of the layer's algorithm (without gradient):
        :func:`capsexp.nn.routers.routed_by_iteration` on these inputs' votes."""
        return routed_by_iteration(self.router, self.votes(inputs), inputs, _lengths(inputs))

    def dynamic_routing_trace(self, inputs: torch.Tensor, iterations: int | None = None) -> RoutingTrace:
        """:func:`capsexp.nn.functional.dynamic_routing_trace` of this layer's dynamic routing on these
        inputs' votes, with every option the layer routes with (scale, none-of-the-above, its capsule
        biases), run for ``iterations`` where given: how a run's routing settles, as the run routes."""
        if not isinstance(self.routing, DynamicRouting):
            raise TypeError(f"only dynamic routing is traced, not {type(self.routing).__name__}")
        routing = self.routing if iterations is None else dataclasses.replace(self.routing, iterations=iterations)
        with torch.no_grad():
            return dynamic_routing_trace(self.votes(inputs), routing, self.router.bias)

    def extra_repr(self) -> str:
        return (
            f"in_caps={self.in_caps}, in_dim={self.in_dim}, out_caps={self.out_caps}, "
            f"out_dim={self.out_dim}, routing={self.routing}"
            + (f", child_types={self.child_types}" if self.child_types is not None else "")
        )
