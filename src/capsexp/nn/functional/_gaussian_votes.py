"""The votes Gaussian routing (:mod:`._gaussian_routing`) reads, as it holds them: made by a :class:`VoteMaker`
chunk by chunk of the batch (:func:`_chunks`), centred and stored beside their squares, [V' | V'^2]
(:func:`_centred_with_squares`), in buffers each chunk reuses (:class:`_Workspace`), and read by the two
products of a routing procedure (:func:`_over_children`, :func:`_over_elements`); and the children they
come from: which child sits in each receptive-field slot (:class:`_Children`), the uniform assignment routing
starts from, and the normalisation over all the parents that receive a child.

Shapes: ``B`` batch, ``Q`` parent positions (1 for a dense layer), ``M`` children in each parent's
receptive field, ``J`` parent capsule types, ``H`` pose elements (16 for 4x4 poses).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from capsexp.nn.functional._exporting import exporting


@dataclasses.dataclass(frozen=True)
class VoteMaker:
    """Votes made on demand from the smaller tensors they come from, one chunk of the batch at a time.

    ``make(*batched, *shared, out=None)`` returns the votes of the batch items in ``batched`` (every
    tensor of it sliced to the chunk along its first dimension), parent-major (b, Q, J, M, H), in any
    strides; :func:`em_routing` passes ``out``, a flat buffer of at least their size that it reuses
    for each chunk, which ``make`` may write them into (with their graph, in the backward pass).
    :func:`em_routing` calls it in the forward pass and again in the backward pass, so that no
    vote-sized tensor is kept between them; the gradients of ``batched`` and ``shared`` come through
    ``make``'s own autograd graph. ``shape`` is (Q, J, M, H), the votes of one batch item.

    Not a NamedTuple: a module that takes one as input would show module hooks (torch's module
    tracker, which FLOP counting uses) its tensors, and views of parameters made under no_grad
    break them.
    """

    make: Callable[..., torch.Tensor]
    batched: tuple[torch.Tensor, ...]
    shared: tuple[torch.Tensor, ...]
    shape: tuple[int, int, int, int]


# The centred votes and their squares that one chunk of the batch routes on at most: routing holds them
# with a few vote-sized gradients of the chunk, so this bounds its memory whatever the batch size.
CHUNK_BYTES = 128 * 2**20


def _given(votes: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The votes of a :class:`VoteMaker` for votes given as a tensor: that tensor."""
    return votes


class _Children(NamedTuple):
    """Which child sits in each receptive-field slot: see em_routing's ``child_index``, ``num_children``."""

    index: torch.Tensor | None
    count: int | None


def _uniform_assignment(shape: torch.Size, activations: torch.Tensor, children: _Children):
    """a_i in each receptive-field slot, (B, Q or 1, 1, M), and the uniform R (B, Q, J, M) routing
    starts from: 1 / the number of parents receiving the child. ``shape``: the votes' (B, Q, J, M, ...)."""
    batch, positions, parents, slots = shape[:4]
    if children.index is None:
        slot_activations = activations.view(batch, 1, 1, slots)  # (B, 1, 1, M)
        fan_out = float(parents)
    else:
        flat_index = children.index.reshape(-1)
        num_children = children.count or int(flat_index.max()) + 1
        slot_activations = activations[:, flat_index].view(batch, positions, 1, slots)
        # Parents receiving each child: (positions whose field holds it) x (parent types).
        counts = _children_counts(flat_index, num_children, activations.dtype)
        fan_out = (counts[flat_index] * parents).view(1, positions, 1, slots)
    return slot_activations, (activations.new_ones(()) / fan_out).expand(batch, positions, parents, slots)


def _children_counts(flat_index: torch.Tensor, num_children: int, dtype: torch.dtype) -> torch.Tensor:
    """How often each child's index occurs in ``flat_index``: (num_children,). Not torch.bincount, whose
    output length depends on the data: torch.compile breaks the graph at each call."""
    ones = torch.ones(flat_index.numel(), dtype=dtype, device=flat_index.device)
    return torch.zeros(num_children, dtype=dtype, device=flat_index.device).index_add_(0, flat_index, ones)


def _rows(tensor: torch.Tensor) -> torch.Tensor:
    """(B, Q, J, M, X) -> (B * Q * J, M, X), a view (of any strides in M and X)."""
    return tensor.view(-1, *tensor.shape[-2:])


def _over_children(weights: torch.Tensor, votes_and_squares: torch.Tensor) -> torch.Tensor:
    """sum_m weights[..., m] [V' | V'^2][..., m, :]: (B, Q, J, M), (B, Q, J, M, 2H) -> (B, Q, J, 2H)."""
    rows = torch.bmm(weights.reshape(-1, 1, weights.shape[-1]), _rows(votes_and_squares))
    return rows.view(*weights.shape[:-1], votes_and_squares.shape[-1])


def _over_elements(votes_and_squares: torch.Tensor, vector: torch.Tensor, constant: torch.Tensor) -> torch.Tensor:
    """constant + sum_h [V' | V'^2][..., h] vector[..., h]: -> (B, Q, J, M). Written x^T V^T, the
    (1 x 2H) @ (2H x M) form BLAS runs fastest here, with the constant added in the same call."""
    rows = torch.baddbmm(
        constant.reshape(-1, 1, 1),
        vector.reshape(-1, 1, vector.shape[-1]),
        _rows(votes_and_squares).transpose(1, 2),
    )
    return rows.view(constant.shape + votes_and_squares.shape[-2:-1])


# Votes given as a tensor (a dense layer's, in memory whole already) are routed in smaller chunks: their
# [V' | V'^2] is then a fraction of the votes' size, and each chunk's gradient is written into the one
# gradient of the votes (VB routing in CapsNet's place: 283 MiB a step with 128 MiB chunks, 134 for uniform).
GIVEN_CHUNK_BYTES = 16 * 2**20


def _chunks(batch: int, shape: tuple[int, ...], dtype: torch.dtype, given: bool = False) -> list[tuple[int, int]]:
    """[lo, hi) ranges of the batch whose [V' | V'^2] take at most CHUNK_BYTES each (GIVEN_CHUNK_BYTES for
    votes ``given`` as a tensor; one item at least); the whole batch while a graph is captured for export
    (its batch size is then left free)."""
    if exporting():
        return [(0, batch)]
    item_bytes = 2 * math.prod(shape) * torch.finfo(dtype).bits // 8
    size = max(1, (GIVEN_CHUNK_BYTES if given else CHUNK_BYTES) // item_bytes)
    return [(lo, min(lo + size, batch)) for lo in range(0, batch, size)]


def _doubled(shape: torch.Size) -> tuple[int, ...]:
    """The shape of [V' | V'^2] for votes of ``shape``."""
    return (*shape[:-1], 2 * shape[-1])


def _chunk_of(inputs, batched: int, lo: int, hi: int) -> list[torch.Tensor]:
    return [tensor[lo:hi] if i < batched else tensor for i, tensor in enumerate(inputs)]


def _centred_with_squares(votes: torch.Tensor, weights: torch.Tensor | None, out: torch.Tensor, centre=None):
    """[V - c | (V - c)^2] (B, Q, J, M, 2H) written into ``out``, from parent-major votes in any strides,
    and c (B, Q, J, 1, H): the mean vote weighted by ``weights`` (B, Q, 1, M) (R a_i at the start, the
    same for every parent type), or ``centre`` if given."""
    elements = votes.shape[-1]
    if out is None:  # a graph captured for export: plain tensors, no buffers
        if centre is None:
            weight_sum = weights.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(votes.dtype).tiny)
            centre = ((weights.unsqueeze(-1) * votes).sum(dim=-2) / weight_sum).unsqueeze(-2)
        centred = votes - centre
        return torch.cat([centred, centred.square()], dim=-1), centre
    centred = out[..., :elements]
    if centre is None:
        weight_sum = weights.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(votes.dtype).tiny)
        centre = (_weighted_sum(weights, votes, centred) / weight_sum).unsqueeze(-2)
    # Copied into the routing's layout and centred in one pass (64-byte runs for the layers' votes).
    torch.sub(votes, centre, out=centred)
    torch.square(centred, out=out[..., elements:])
    return out, centre


def _weighted_sum(weights: torch.Tensor, votes: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """sum_m weights[b, q, 0, m] V[b, q, j, m, :]: (B, Q, J, H). Read where the votes lie: for the
    layers' votes, whose (J, H) are contiguous for each child, as one (1 x M) @ (M x J*H) product per
    position (long rows; twice as fast as a product per parent); otherwise one per parent, on a
    contiguous copy in ``scratch``."""
    batch, positions, parents, slots, elements = votes.shape
    stride_b, stride_q, stride_j, stride_m, stride_h = votes.stride()
    rows = weights.reshape(batch * positions, 1, slots)
    if stride_h == 1 and stride_j == elements and stride_b == stride_q * positions:
        per_child = votes.as_strided((batch * positions, slots, parents * elements), (stride_q, stride_m, 1))
        return torch.bmm(rows, per_child).view(batch, positions, parents, elements)
    return _over_children(weights.expand(-1, -1, parents, -1), scratch.copy_(votes))


class _Workspace:
    """The vote-sized buffers of one call, reused by each chunk: a fresh tensor of that size costs more
    in page faults (the allocator maps it anew each time) than the pass that fills it."""

    def __init__(self, like: torch.Tensor) -> None:
        self.like, self.buffers = like, {}

    def take(self, name: str, shape: tuple[int, ...]) -> torch.Tensor | None:
        """A contiguous tensor of ``shape``, made from the buffer ``name``; None while a graph is captured
        for export (a buffer's size would be fixed in it: the caller makes a tensor of its own)."""
        if exporting():
            return None
        size = math.prod(shape)
        buffer = self.buffers.get(name)
        if buffer is None or buffer.numel() < size:
            buffer = self.buffers[name] = self.like.new_empty(size)
        return buffer[:size].view(shape)

    def take_like(self, name: str, tensor: torch.Tensor) -> torch.Tensor | None:
        """A tensor in the layout of ``tensor`` (its dimensions in the same memory order); None where
        that is contiguous or has no such layout (overlaps itself or has gaps)."""
        order = sorted(range(tensor.ndim), key=lambda d: tensor.stride(d), reverse=True)
        if tensor.is_contiguous() or not tensor.permute(order).is_contiguous():
            return None
        in_order = self.take(name, tuple(tensor.shape[d] for d in order))
        return in_order.permute([order.index(d) for d in range(tensor.ndim)])


def _normalise_per_child(log_r: torch.Tensor, children: _Children) -> torch.Tensor:
    """exp(log_r) (B, Q, J, M) normalised to sum to 1 over every (position, parent type) holding a child."""
    child_index, num_children = children
    if child_index is None:
        return torch.softmax(log_r, dim=2)
    num_children = num_children or int(child_index.max()) + 1
    batch, positions, _, slots = log_r.shape
    flat_index = child_index.reshape(-1).expand(batch, -1)  # (B, Q*M)
    slot_max = log_r.amax(dim=2).reshape(batch, -1)  # (B, Q*M)
    child_max = slot_max.new_full((batch, num_children), -torch.inf)
    child_max = child_max.scatter_reduce(1, flat_index, slot_max, reduce="amax").detach()
    exponentials = torch.exp(log_r - child_max.gather(1, flat_index).view(batch, positions, 1, slots))
    slot_sum = exponentials.sum(dim=2).reshape(batch, -1)
    child_sum = slot_sum.new_zeros(batch, num_children).scatter_add(1, flat_index, slot_sum)
    return exponentials * child_sum.gather(1, flat_index).reciprocal().view(batch, positions, 1, slots)
