"""EM routing and the spread loss (Hinton, Sabour & Frosst 2018, "Matrix capsules with EM routing").

Shapes: ``B`` batch, ``Q`` parent positions (1 for a dense layer), ``M`` children in each parent's
receptive field, ``J`` parent capsule types, ``H`` pose elements (16 for 4x4 poses).

In a convolutional capsule layer a child lies in the receptive fields of several parent positions.
The paper routes it among *all* the parents that receive it: its responsibilities sum to 1 over every
(parent position, parent type) pair that sees it. ``child_index[q, m]`` names the child in slot m of
position q's receptive field, and the E-step normalises over all slots holding the same child.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
import math
import warnings
from collections.abc import Callable
from typing import NamedTuple, get_args

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from capsexp.config.routing_options import EM_PAPER, CostNormalization, EMRouting
from capsexp.nn.functional._export import exporting

LOG_2PI = math.log(2 * math.pi)
COST_NORMALIZATIONS: tuple[str, ...] = get_args(CostNormalization)


# The variance floor of routing.sigma_eps=None: the matrix-capsule layers' (capsexp.nn.EMRouting).
MATRIX_FLOOR = 0.01


# Standardised costs: a spread of the costs below this fraction of their mean size is rounding, not a
# difference between the parents (float32 rounds at 6e-8 of a value).
TIE_SCALE = 1e-4


def variance_floor(routing: EMRouting) -> float:
    """The floor added to every variance: ``routing.sigma_eps``, or :data:`MATRIX_FLOOR` where unset."""
    return MATRIX_FLOOR if routing.sigma_eps is None else routing.sigma_eps


def inverse_temperatures(routing: EMRouting) -> list[float]:
    """lambda_t = final_lambda * (1 - 0.95^(t+1)) for t = 0..iterations-1 (the authors' schedule)."""
    return [routing.final_lambda * (1.0 - 0.95 ** (t + 1)) for t in range(routing.iterations)]


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


def em_routing(
    votes: torch.Tensor | VoteMaker,
    activations: torch.Tensor,
    beta_u: torch.Tensor,
    beta_a: torch.Tensor,
    routing: EMRouting = EM_PAPER,
    child_index: torch.Tensor | None = None,
    num_children: int | None = None,
    return_responsibilities: bool = False,
    inverse_temperature_scale: torch.Tensor | None = None,
):
    """Procedure 1 of the paper: parent poses and activations from votes and child activations.

    R_ij starts uniform over the parents of each child. Each iteration runs the M-step
    (R'_ij = R_ij a_i; mu_jh and sigma_jh^2 are the R'-weighted mean and variance of the votes;
    cost_h = (beta_u + log sigma_jh) sum_i R'_ij; a_j = sigmoid(lambda_t (beta_a - sum_h cost_h))) and,
    except after the last, the E-step: R_ij proportional to a_j N(V_ij; mu_j, sigma_j^2), normalised
    over the parents of child i.

    Args:
        votes: V, shape (B, I, J, H) for a dense layer, or (B, Q, M, J, H) for a convolutional one; or
            a :class:`VoteMaker` that makes them (parent-major), as the matrix-capsule layers pass them.
        activations: child activations a_i: (B, I) dense; (B, num_children) with ``child_index``.
        beta_u, beta_a: learned per parent type, shape (J,) (broadcast over positions).
        routing: the routing options (:class:`~capsexp.nn.EMRouting`, where each is explained with its
            source and checked when built): iterations, the inverse temperatures' final_lambda (see
            :func:`inverse_temperatures`), the variance floor sigma_eps, cost_normalization, whether
            the E-steps' responsibilities are constants to the backward pass (detach_responsibilities)
            and the E-step's temperature. The default, :data:`~capsexp.nn.EM_PAPER`, is the paper's.
        child_index: (Q, M) long, the child in each receptive-field slot (convolutional layers).
        num_children: number of distinct children (default: ``child_index.max() + 1``).
        return_responsibilities: also return R, shape of ``votes`` without H.
        inverse_temperature_scale: a scalar tensor s multiplying every lambda_t (default 1): a
            learned inverse temperature (log-parametrised by the layers), not in the paper.

    Returns:
        poses mu (B, J, H) or (B, Q, J, H); activations a_j (B, J) or (B, Q, J) [; R].

    How the options of ``routing`` enter Procedure 1 (the paper's values in brackets):

    - ``sigma_eps`` is added to every variance sigma_h^2 [none given]: it keeps log sigma and
      1/sigma^2 finite when all votes agree exactly (sigma -> 0).
    - ``cost_normalization``, how the cost enters the sigmoid [``"none"``]. ``"data"``: the amount
      of data sum_i R'_ij in the cost is divided by its mean over the parent types of the position,
      so that the cost no longer grows with the number of children a layer has (Gritzman 2019,
      pitfall 2, in a scale-free form). ``"standardize"``: the costs are standardised over the parent
      types of each position, (cost - mean) / (std + :data:`TIE_SCALE` mean |cost|), so that costs tied
      up to rounding stay tied. ``"layer"``: the amount of data is divided by the children per parent
      in a receptive field, M / J, a constant of the layer (IBM/matrix-capsules-with-em-routing's
      layer normalisation factor, less its constant 100).
    - ``detach_responsibilities`` [false: "backpropagating through the unrolled iterations of EM"]:
      if true, the responsibilities each E-step computes are constants to the backward pass, so the
      gradient reaches the votes through the M-steps' weighted sums alone.
    - ``e_step_temperature`` T divides the E-step's log-likelihood [1]: R_ij proportional to
      a_j N(V_ij; mu_j, sigma_j^2)^(1/T); T > 1 softens the assignments (each of the H pose elements
      adds its own log-likelihood ratio, so T = H weighs a vote as one observation).

    Computation: the votes are first centred, V' = V - c with c each parent's mean vote weighted by
    R a_i at the start (the first M-step's mu; detached: routing is translation-equivariant, mu(V) =
    c + mu(V - c) with everything else unchanged, so c carries no gradient of its own). V' and V'^2
    are stored side by side, [V' | V'^2] (one (M, 2H) matrix per parent), and the Gaussian expanded on
    them: sum R'(V' - mu')^2 = sum R'V'^2 - 2 mu' sum R'V' + mu'^2 sum R', and the E-step's
    log a_j N(V'; mu', sigma^2) = [V' | V'^2] . [mu' / sigma^2 | -1 / (2 sigma^2)] + (terms of j alone).
    So each M-step reads the votes once (one batched vector-matrix product gives both sums) and each
    E-step once (one product, its constant added in the same call, gives log R). Centring is what
    keeps float32 exact: expanded around 0, votes far from zero compared with their spread cancel
    catastrophically (offset 20, spread 0.01: activations off by 0.1, vote gradients by 100%); around
    c, each term is of the order of the spread of the votes that carry weight (weighted, c stays near
    the parents' means also where inactive children vote far from the active ones).

    Memory: the batch is routed in chunks of at most :data:`CHUNK_BYTES` of [V' | V'^2]; the
    backward pass (:class:`_EMRouting`) keeps no vote-sized tensor from the forward pass (a
    :class:`VoteMaker` makes the votes again; votes given as a tensor are the caller's), replays the
    iterations from the products the forward pass kept, and builds the gradient of V from low-rank
    factors instead of keeping every intermediate. The chunks' vote-sized tensors reuse buffers
    allocated once per call.

    Safeguards, in float32 at least whatever the input dtype (also under autocast): the variance is
    clamped at 0 before adding ``sigma_eps`` (the expansion can round below 0); sums of R' are
    floored at 1e-8 before dividing (which keeps mu translation-equivariant; a parent that receives
    no data sits near c); the E-step runs in the log domain (log a_j is ``logsigmoid`` of its
    argument, the normalisation a log-sum-exp per child), so R is never 0/0.
    """
    dense = child_index is None
    if isinstance(votes, VoteMaker):
        maker = votes
    elif dense:
        if votes.ndim != 4:
            raise ValueError("convolutional votes (B, Q, M, J, H) need child_index (Q, M)")
        # (B, I, J, H) -> parent-major (B, 1, J, I, H), a view
        maker = VoteMaker(_given, (votes.transpose(1, 2).unsqueeze(1),), (), (1, *votes.shape[2:0:-1], votes.shape[3]))
    else:
        if votes.ndim != 5:
            raise ValueError("child_index is for convolutional votes (B, Q, M, J, H)")
        maker = VoteMaker(_given, (votes.transpose(2, 3),), (), (votes.shape[1], votes.shape[3], *votes.shape[2::2]))
    with torch.autocast(device_type=activations.device.type, enabled=False):
        dtype = torch.promote_types(maker.batched[0].dtype, torch.float32)  # float32 at least
        children = _Children(child_index, num_children)
        scale = beta_u.new_ones(()) if inverse_temperature_scale is None else inverse_temperature_scale
        small = [t.to(dtype) for t in (activations.unsqueeze(1) if dense else activations, beta_u, beta_a, scale)]
        mu, parent_activations, responsibilities = _route(
            maker.make, maker.shape, routing, children, len(maker.batched), *small, *maker.batched, *maker.shared
        )

    responsibilities = responsibilities.transpose(2, 3)  # (B, Q, M, J)
    if dense:
        mu, parent_activations, responsibilities = mu[:, 0], parent_activations[:, 0], responsibilities[:, 0]
    if return_responsibilities:
        return mu, parent_activations, responsibilities
    return mu, parent_activations


def _given(votes: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The votes of a :class:`VoteMaker` for votes given as a tensor: that tensor."""
    return votes


class _Children(NamedTuple):
    """Which child sits in each receptive-field slot: see em_routing's ``child_index``, ``num_children``."""

    index: torch.Tensor | None
    count: int | None


def _em_iterations(
    votes_and_squares,
    slot_activations,
    uniform,
    beta_u,
    beta_a,
    temperature_scale,
    routing: EMRouting,
    children: _Children,
    products,
):
    """Procedure 1 on parent-major [V' | V'^2] (B, Q, J, M, 2H) (centred votes: see em_routing).

    ``products`` computes the only two operations that read the vote-sized tensor:
    ``products.over_children(weights)``: sum_m weights[..., m] [V' | V'^2][..., m, :], (B, Q, J, 2H);
    ``products.over_elements(vector, constant)``: constant + sum_h [V' | V'^2][..., h] vector[..., h],
    (B, Q, J, M). ``slot_activations`` a_i in each slot, (B, Q or 1, 1, M); ``uniform`` the starting R.
    Returns mu (B, Q, J, H), a (B, Q, J), R (B, Q, J, M).
    """
    _, _, parents, slots, doubled = votes_and_squares.shape
    elements = doubled // 2
    responsibilities = uniform
    for t, inverse_temperature in enumerate(inverse_temperatures(routing)):
        # M-step: R'_ij = R_ij a_i; mu_j and sigma_j^2 weighted by R'; cost; a_j.
        weighted = responsibilities * slot_activations  # (B, Q, J, M)
        weight_sum = weighted.sum(dim=-1, keepdim=True)  # (B, Q, J, 1)
        denominator = weight_sum.clamp_min(1e-8)
        sums = products.over_children(weighted)
        first, second = sums[..., :elements], sums[..., elements:]  # sum_i R' V', sum_i R' V'^2
        mu = first / denominator
        # sum_i R' (V - mu)^2 / denominator, expanded (exact also where the floor shrinks mu).
        variance = ((second - 2 * mu * first + mu.square() * weight_sum) / denominator).clamp_min(0)
        variance = variance + variance_floor(routing)
        log_variance = torch.log(variance)
        amount = weight_sum  # sum_i R'_ij
        if routing.cost_normalization == "data":
            amount = weight_sum / (weight_sum.mean(dim=2, keepdim=True) + 1e-8)
        elif routing.cost_normalization == "layer":
            amount = weight_sum * (parents / slots)
        cost = ((beta_u.view(-1, 1) + 0.5 * log_variance) * amount).sum(dim=-1)  # (B, Q, J)
        if routing.cost_normalization == "standardize":
            # Costs that tie differ by rounding alone, which a bare std would blow up to unit spread (tied
            # parents then got activations of 0 or 1 by chance): spreads below TIE_SCALE of the costs'
            # size count as ties.
            scale = cost.std(dim=-1, keepdim=True) + TIE_SCALE * cost.abs().mean(dim=-1, keepdim=True) + 1e-8
            cost = (cost - cost.mean(dim=-1, keepdim=True)) / scale
        logit = inverse_temperature * temperature_scale * (beta_a - cost)
        parent_activations = torch.sigmoid(logit)
        if t == routing.iterations - 1:
            break
        # E-step: log a_j N(V'_ij; mu_j, sigma_j^2)^(1/T) = [V' | V'^2] . vector + constant.
        precision = 1.0 / variance
        vector = torch.cat([mu * precision, -0.5 * precision], dim=-1) / routing.e_step_temperature
        normaliser = (mu.square() * precision + log_variance).sum(dim=-1) + elements * LOG_2PI
        constant = F.logsigmoid(logit) - (0.5 / routing.e_step_temperature) * normaliser
        responsibilities = _normalise_per_child(products.over_elements(vector, constant), children)
        if routing.detach_responsibilities:  # the backward pass (run on a graph) then skips the E-step
            responsibilities = responsibilities.detach()
    return mu, parent_activations, responsibilities


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


class _Products:
    """The forward pass's products: computed, and kept in ``kept`` for the backward pass to replay."""

    def __init__(self, votes_and_squares: torch.Tensor) -> None:
        self.votes_and_squares, self.kept = votes_and_squares, []

    def over_children(self, weights):
        self.kept.append(_over_children(weights, self.votes_and_squares))
        return self.kept[-1]

    def over_elements(self, vector, constant):
        self.kept.append(_over_elements(self.votes_and_squares, vector, constant))
        return self.kept[-1]


class _ReplayedProducts:
    """The backward pass's products: each returns what the forward pass computed (no read of the
    votes), as a :class:`_Replayed` node whose backward reads them once for its inputs' gradient and
    records the factors of theirs."""

    def __init__(self, votes_and_squares: torch.Tensor, kept: list[torch.Tensor], anchor: torch.Tensor) -> None:
        self.votes_and_squares, self.kept, self.anchor = votes_and_squares, iter(kept), anchor
        self.factors: tuple[list, list] = ([], [])  # over m, over [h | h]

    def over_children(self, weights):
        return _Replayed.apply(next(self.kept), self, self.anchor, weights)

    def over_elements(self, vector, constant):
        return _Replayed.apply(next(self.kept), self, self.anchor, vector, constant)


class _Replayed(torch.autograd.Function):
    """One product of the iterations, replayed: its output is the forward pass's; its backward pass
    returns the gradients of its small inputs and appends the (child-vector, element-vector) factor
    pair of the gradient of [V' | V'^2] (an outer product) to ``products.factors``. ``anchor``, an
    empty tensor that requires grad, keeps every product in the graph, also the first, whose weights
    need no gradient when the activations are constants."""

    @staticmethod
    def forward(ctx, kept, products, anchor, *small):
        ctx.products = products
        ctx.save_for_backward(*small)
        return kept

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        small = ctx.saved_tensors
        products, ctx.products = ctx.products, None  # no cycle through the graph
        over_m, over_h = products.factors
        votes_and_squares = products.votes_and_squares
        if len(small) == 1:  # out_h = sum_m w_m X_mh: g(w_m) = sum_h g_h X_mh
            (weights,) = small
            over_m.append(weights), over_h.append(grad)
            zero = grad.new_zeros(grad.shape[:-1])
            return None, None, None, _over_elements(votes_and_squares, grad, zero)
        vector, _ = small  # out_m = c + sum_h X_mh x_h: g(x_h) = sum_m g_m X_mh, g(c) = sum_m g_m
        over_m.append(grad), over_h.append(vector)
        return None, None, None, _over_children(grad, votes_and_squares), grad.sum(dim=-1)


@torch.compiler.disable
def _route(*inputs):
    """:class:`_EMRouting`, left out of torch.compile's graphs: its backward pass records factors in a
    Python list, which dynamo cannot trace; it tried at every layer and fell back to this anyway, at
    twice the compile time of a MatrixCapsNet."""
    if exporting():  # the forward pass alone, which the exporters trace (no backward is exported)
        return tuple(_forward(*inputs)[0])
    return _EMRouting.apply(*inputs)


def _chunks(batch: int, shape: tuple[int, ...], dtype: torch.dtype) -> list[tuple[int, int]]:
    """[lo, hi) ranges of the batch whose [V' | V'^2] take at most CHUNK_BYTES each (one item at least);
    the whole batch while a graph is captured for export (its batch size is then left free)."""
    if exporting():
        return [(0, batch)]
    item_bytes = 2 * math.prod(shape) * torch.finfo(dtype).bits // 8
    size = max(1, CHUNK_BYTES // item_bytes)
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


def _forward(make_votes, shape, routing, children, batched, activations, beta_u, beta_a, scale, *inputs):
    """:class:`_EMRouting`'s forward pass, chunk by chunk: the outputs (mu, a_j, R), and the products and
    centres its backward pass replays from. Called alone while a graph is captured for export."""
    dtype = activations.dtype
    results, kept, centres, workspace = [], [], [], _Workspace(activations)
    for lo, hi in _chunks(activations.shape[0], shape, dtype):
        chunk = [t.to(dtype) for t in _chunk_of(inputs, batched, lo, hi)]
        buffer = workspace.take("votes", (hi - lo, *shape))
        votes = make_votes(*chunk, out=None if buffer is None else buffer.view(-1))
        slot_activations, uniform = _uniform_assignment(votes.shape, activations[lo:hi], children)
        out = workspace.take("votes_and_squares", _doubled(votes.shape))
        weights = uniform[:, :, :1] * slot_activations  # (b, Q, 1, M)
        votes_and_squares, centre = _centred_with_squares(votes, weights, out)
        del votes
        products = _Products(votes_and_squares)
        mu, parent_activations, responsibilities = _em_iterations(
            votes_and_squares, slot_activations, uniform, beta_u, beta_a, scale, routing, children, products
        )
        results.append((mu + centre.squeeze(-2), parent_activations, responsibilities))
        kept.append(products.kept)
        centres.append(centre)
    outputs = [torch.cat(parts) if len(results) > 1 else parts[0] for parts in zip(*results, strict=True)]
    return outputs, kept, centres


class _EMRouting(torch.autograd.Function):
    """EM routing, chunk by chunk of the batch, whose backward pass never holds more than a few
    vote-sized tensors of one chunk.

    Forward: for each chunk, its votes made and centred, Procedure 1 without a graph, the products
    that read the votes kept (small: (B, Q, J, 2H) per M-step, (B, Q, J, M) per E-step) with the
    centres. Backward: for each chunk, its votes made again (on a graph to the vote maker's inputs),
    the iterations replayed on a graph of the small tensors from the kept products (:class:`_Replayed`),
    the gradient of [V' | V'^2] built from the factors the replay recorded with two batched matmuls,
    and taken back through the vote maker.
    """

    @staticmethod
    def forward(ctx, make_votes, shape, routing, children, batched, activations, beta_u, beta_a, scale, *inputs):
        outputs, kept, centres = _forward(
            make_votes, shape, routing, children, batched, activations, beta_u, beta_a, scale, *inputs
        )
        ctx.make_votes, ctx.shape, ctx.routing, ctx.children, ctx.batched = (
            make_votes,
            shape,
            routing,
            children,
            batched,
        )
        ctx.kept_count = len(kept[0])
        ctx.save_for_backward(activations, beta_u, beta_a, scale, *inputs, *centres, *(t for k in kept for t in k))
        ctx.mark_non_differentiable(outputs[2])
        return tuple(outputs)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_mu, grad_activations, _grad_responsibilities):
        # As the forward pass: in float32 at least, also where backward() is called under autocast.
        with torch.autocast(device_type=grad_mu.device.type, enabled=False):
            return _EMRouting._gradients(ctx, grad_mu, grad_activations)

    @staticmethod
    def _gradients(ctx, grad_mu, grad_activations):
        saved = ctx.saved_tensors
        small, rest = saved[:4], saved[4:]  # activations, beta_u, beta_a, scale
        inputs, rest = rest[: len(ctx.needs_input_grad) - 9], rest[len(ctx.needs_input_grad) - 9 :]
        chunks = _chunks(small[0].shape[0], ctx.shape, small[0].dtype)
        centres, kept = rest[: len(chunks)], rest[len(chunks) :]
        needs_small, needs_inputs = ctx.needs_input_grad[5:9], ctx.needs_input_grad[9:]
        dtype = small[0].dtype
        small_grads = [[] for _ in small]
        input_grads = [[] for _ in inputs]
        workspace = _Workspace(small[0])
        for number, (lo, hi) in enumerate(chunks):
            activations = small[0][lo:hi]
            leaves = [
                tensor.detach().requires_grad_(needed)
                for tensor, needed in zip([activations, *small[1:]], needs_small, strict=True)
            ]
            vote_leaves = [
                tensor.detach().requires_grad_(needed)
                for tensor, needed in zip(_chunk_of(inputs, ctx.batched, lo, hi), needs_inputs, strict=True)
            ]
            with torch.enable_grad():
                buffer = workspace.take("votes", (hi - lo, *ctx.shape)).view(-1)
                votes = ctx.make_votes(*[t.to(dtype) for t in vote_leaves], out=buffer)
            out = workspace.take("votes_and_squares", _doubled(votes.shape))
            votes_and_squares, _ = _centred_with_squares(votes.detach(), None, out, centres[number])
            anchor = votes_and_squares.new_empty(0, requires_grad=True)
            products = _ReplayedProducts(
                votes_and_squares, list(kept[number * ctx.kept_count : (number + 1) * ctx.kept_count]), anchor
            )
            with torch.enable_grad():
                slot_activations, uniform = _uniform_assignment(votes.shape, leaves[0], ctx.children)
                mu, parent_activations, _ = _em_iterations(
                    votes_and_squares, slot_activations, uniform, *leaves[1:], ctx.routing, ctx.children, products
                )
                wanted = [leaf for leaf in leaves if leaf.requires_grad]
                grads = torch.autograd.grad(
                    (mu, parent_activations),
                    [anchor, *wanted],
                    (grad_mu[lo:hi], grad_activations[lo:hi]),
                    allow_unused=True,
                )
            # The replayed graph goes now: a product it never reached still holds this chunk's votes.
            del mu, parent_activations
            grads = iter(grads[1:])
            for collected, leaf in zip(small_grads, leaves, strict=True):
                collected.append(next(grads) if leaf.requires_grad else None)
            if any(needs_inputs):
                grad_votes = _vote_gradient(votes_and_squares, *products.factors, workspace, votes)
                del votes_and_squares, products
                wanted = [leaf for leaf in vote_leaves if leaf.requires_grad]
                grads = iter(torch.autograd.grad(votes, wanted, grad_votes, allow_unused=True))
                for collected, leaf in zip(input_grads, vote_leaves, strict=True):
                    grad = next(grads) if leaf.requires_grad else None
                    # Votes given as a tensor get (a view of) the buffer back, which the next chunk reuses.
                    collected.append(grad.clone() if _shares_memory(grad, grad_votes) else grad)
        small_grads = [_joined(parts, batched=i == 0) for i, parts in enumerate(small_grads)]
        input_grads = [_joined(parts, batched=i < ctx.batched) for i, parts in enumerate(input_grads)]
        return None, None, None, None, None, *small_grads, *input_grads


def _shares_memory(tensor: torch.Tensor | None, other: torch.Tensor) -> bool:
    return tensor is not None and tensor.untyped_storage().data_ptr() == other.untyped_storage().data_ptr()


def _joined(parts: list, batched: bool):
    """The gradient of an input from its chunks' parts: concatenated along the batch, or summed."""
    if not parts or parts[0] is None:
        return None
    if batched:
        return torch.cat(parts) if len(parts) > 1 else parts[0]
    return functools.reduce(torch.add, parts)


def _vote_gradient(votes_and_squares, over_m: list, over_h: list, workspace: _Workspace, votes) -> torch.Tensor:
    """g(V') = G[..., :H] + 2 V' * G[..., H:], G = sum_t over_m[t] (x) over_h[t] the gradient of
    [V' | V'^2] (the factor pairs the replay recorded), in a buffer of ``workspace`` laid out as
    ``votes`` are where they have a layout (then the vote maker's backward pass copies nothing).

    Large chunks take the fused form (:func:`_vote_gradient_fused`, compiled), others two batched
    matmuls, (B, Q, J, M, T) @ (B, Q, J, T, 2H), one per half, and a copy into the layout."""
    left = torch.stack(over_m, dim=-2).transpose(-1, -2)  # (B, Q, J, M, T), stacked contiguously
    right = torch.stack(over_h, dim=-2)  # (B, Q, J, T, 2H)
    in_layout = workspace.take_like("grad_votes_in_layout", votes)
    if votes_and_squares.numel() >= FUSED_MIN_ELEMENTS and _FUSED_VOTE_GRADIENT.usable:
        out = workspace.take("grad_votes", votes.shape) if in_layout is None else in_layout
        _FUSED_VOTE_GRADIENT(votes_and_squares, left, right, out)
        return out
    elements = votes.shape[-1]
    grad = _rows(workspace.take("grad_votes", votes.shape))
    left, right = _rows(left), _rows(right)
    torch.bmm(left, 2 * right[..., elements:], out=grad).mul_(_rows(votes_and_squares)[..., :elements])
    grad.baddbmm_(left, right[..., :elements])
    grad = grad.view(votes.shape)
    return grad if in_layout is None else in_layout.copy_(grad)


def _vote_gradient_fused(votes_and_squares, left, right, out) -> None:
    """:func:`_vote_gradient`'s arithmetic as one pass that torch.compile fuses into a single loop
    over the votes (reading V' once, writing ``out`` in its own layout): a quarter of the passes of
    the matmul form."""
    elements = out.shape[-1]
    centred = votes_and_squares[..., :elements].unsqueeze(-2)  # (B, Q, J, M, 1, H)
    first, second = right[..., :elements].unsqueeze(-3), right[..., elements:].unsqueeze(-3)  # (..., 1, T, H)
    out.copy_((left.unsqueeze(-1) * (first + 2 * centred * second)).sum(dim=-2))


class _Compiled:
    """``function`` compiled by torch.compile at its first call (Inductor: C++ on the CPU, Triton on
    a GPU). Where compiling fails (no C++ compiler, say), a warning names the cause and the callers'
    eager forms are used from then on (``usable`` turns False)."""

    def __init__(self, function: Callable) -> None:
        self.function, self.compiled, self.usable = function, None, True

    def __call__(self, *args) -> None:
        try:
            if self.compiled is None:
                _import_quietly("torch.utils.cpp_extension")
                self.compiled = torch.compile(self.function, fullgraph=True)
            self.compiled(*args)
        except Exception as error:  # compilers fail in many ways; the eager form is always right
            self.usable = False
            warnings.warn(
                f"EM routing: compiling {self.function.__name__} failed ({type(error).__name__}: {error}); "
                "using its eager form, which is slower.",
                RuntimeWarning,
                stacklevel=2,
            )
            self.function(*args)


def _import_quietly(module: str) -> None:
    """Import ``module`` with its logger's warnings held back: Inductor imports cpp_extension, which
    warns at import that a CUDA build of torch finds no CUDA runtime, true and irrelevant on a CPU."""
    logger = logging.getLogger(module)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        importlib.import_module(module)
    finally:
        logger.setLevel(level)


# Chunks with at least this many elements of [V' | V'^2] take the compiled vote gradient: below it,
# compiling (seconds, once per process and shape) costs more than the passes it saves.
FUSED_MIN_ELEMENTS = 2**22
_FUSED_VOTE_GRADIENT = _Compiled(_vote_gradient_fused)


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


def responsibility_entropy(
    responsibilities: torch.Tensor, child_index: torch.Tensor | None = None, num_children: int | None = None
) -> torch.Tensor:
    """Entropy of each child's responsibilities over all the parents that receive it, divided by its
    maximum log(number of those parents): 1 is uniform (routing undecided), 0 is a hard assignment.

    ``responsibilities`` as :func:`em_routing` returns them: (B, I, J) dense, or (B, Q, M, J) with
    ``child_index`` (Q, M). Returns (B, children).
    """
    plogp = torch.special.xlogy(responsibilities, responsibilities)
    parents = responsibilities.shape[-1]
    if child_index is None:
        return -plogp.sum(dim=-1) / math.log(parents)
    num_children = num_children or int(child_index.max()) + 1
    flat_index = child_index.reshape(-1)
    batch = responsibilities.shape[0]
    per_child = plogp.new_zeros(batch, num_children).index_add_(1, flat_index, plogp.sum(dim=-1).reshape(batch, -1))
    fan_out = _children_counts(flat_index, num_children, plogp.dtype) * parents
    return -per_child / torch.log(fan_out).clamp_min(1e-8)


def spread_loss(activations: torch.Tensor, targets: torch.Tensor, margin: float | torch.Tensor) -> torch.Tensor:
    """L = sum_{i != t} max(0, m - (a_t - a_i))^2 (section 3.1), averaged over the batch."""
    target_activation = activations.gather(1, targets.unsqueeze(1))
    gaps = F.relu(margin - (target_activation - activations)).pow(2)
    others = 1.0 - F.one_hot(targets, activations.shape[-1]).to(gaps.dtype)
    return (gaps * others).sum(dim=-1).mean()
