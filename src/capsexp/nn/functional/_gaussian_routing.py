"""The machinery EM and VB routing share: routing a Gaussian mixture of the votes on the centred votes and
their squares, [V' | V'^2], chunk by chunk of the batch, with a backward pass that keeps no vote-sized
tensor between the passes.

A routing procedure (EM's in ``_em_routing.py``, VB's in ``_vb_routing.py``) is written as its paper writes
it, with its two reads of the votes given as products (:class:`_Products`): ``over_children(weights)``,
the weighted sums over each parent's children of [V' | V'^2] (its M-step), and
``over_elements(vector, constant)``, the dot product of every vote's [V' | V'^2] with a vector of its
parent (its E-step). :func:`gaussian_routing` runs it:

- forward: the votes made (:class:`VoteMaker`) and centred on c, each parent's mean vote weighted by
  the starting assignment (detached), the procedure run without a graph, its products kept (small);
- backward: the votes made again, the procedure replayed on a graph of its small tensors from the kept
  products (:class:`_Replayed`, no read of the votes), and the gradient of [V' | V'^2] built from the
  low-rank factors the replay recorded, then taken back through the vote maker.

A procedure is ``procedure(votes_and_squares, centre, slot_activations, uniform, beta_u, beta_a, scale,
routing, children, products) -> (poses, activations, responsibilities)``: [V' | V'^2] (B, Q, J, M, 2H),
c (B, Q, J, 1, H), a_i in each receptive-field slot (B, Q or 1, 1, M), the uniform starting assignment
(B, Q, J, M), the parameters (J,) and a scalar, the options, :class:`_Children`, the products; poses
(B, Q, J, H), activations (B, Q, J) and responsibilities (B, Q, J, M).

How the votes are made, chunked, centred, held and read is in ``_gaussian_votes.py``.

Shapes: ``B`` batch, ``Q`` parent positions (1 for a dense layer), ``M`` children in each parent's
receptive field, ``J`` parent capsule types, ``H`` pose elements (16 for 4x4 poses).
"""

from __future__ import annotations

import functools
import importlib
import logging
import warnings
from collections.abc import Callable

import torch
from torch.autograd.function import once_differentiable

from capsexp.nn.functional._exporting import exporting
from capsexp.nn.functional._gaussian_votes import (
    VoteMaker,
    _centred_with_squares,
    _Children,
    _chunk_of,
    _chunks,
    _doubled,
    _given,
    _over_children,
    _over_elements,
    _rows,
    _uniform_assignment,
    _Workspace,
)


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


def gaussian_routing(
    procedure: Callable,
    votes: torch.Tensor | VoteMaker,
    activations: torch.Tensor,
    beta_u: torch.Tensor,
    beta_a: torch.Tensor,
    routing,
    child_index: torch.Tensor | None = None,
    num_children: int | None = None,
    scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run a routing ``procedure`` (see the module) on votes V: (B, I, J, H) for a dense layer, (B, Q, M, J,
    H) with ``child_index`` (Q, M) for a convolutional one, or a :class:`VoteMaker` of parent-major votes;
    child activations (B, I), or (B, ``num_children``) with ``child_index``; ``scale`` a scalar the
    procedure may use (1 where not given). In float32 at least whatever the input dtype, with autocast off.

    Returns poses (B, J, H) or (B, Q, J, H), activations (B, J) or (B, Q, J), and responsibilities (B, I, J)
    or (B, Q, M, J)."""
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
        scale = beta_u.new_ones(()) if scale is None else scale
        small = [t.to(dtype) for t in (activations.unsqueeze(1) if dense else activations, beta_u, beta_a, scale)]
        poses, parent_activations, responsibilities = _route(
            procedure,
            maker.make,
            maker.shape,
            routing,
            children,
            len(maker.batched),
            *small,
            *maker.batched,
            *maker.shared,
        )
    responsibilities = responsibilities.transpose(2, 3)  # (B, Q, M, J)
    if dense:
        return poses[:, 0], parent_activations[:, 0], responsibilities[:, 0]
    return poses, parent_activations, responsibilities


@torch.compiler.disable
def _route(*inputs):
    """:class:`_GaussianRouting`, left out of torch.compile's graphs: its backward pass records factors in a
    Python list, which dynamo cannot trace; it tried at every layer and fell back to this anyway, at
    twice the compile time of a MatrixCapsNet."""
    if exporting():  # the forward pass alone, which the exporters trace (no backward is exported)
        return tuple(_forward(*inputs)[0])
    return _GaussianRouting.apply(*inputs)


def _forward(procedure, make_votes, shape, routing, children, batched, activations, beta_u, beta_a, scale, *inputs):
    """:class:`_GaussianRouting`'s forward pass, chunk by chunk: the outputs (poses, activations, R), and the
    products and centres its backward pass replays from. Called alone while a graph is captured for export."""
    dtype = activations.dtype
    results, kept, centres, workspace = [], [], [], _Workspace(activations)
    for lo, hi in _chunks(activations.shape[0], shape, dtype, given=make_votes is _given):
        chunk = [t.to(dtype) for t in _chunk_of(inputs, batched, lo, hi)]
        # Votes given as a tensor are that tensor: no buffer to make them in.
        buffer = None if make_votes is _given else workspace.take("votes", (hi - lo, *shape))
        votes = make_votes(*chunk, out=None if buffer is None else buffer.view(-1))
        slot_activations, uniform = _uniform_assignment(votes.shape, activations[lo:hi], children)
        out = workspace.take("votes_and_squares", _doubled(votes.shape))
        weights = uniform[:, :, :1] * slot_activations  # (b, Q, 1, M)
        votes_and_squares, centre = _centred_with_squares(votes, weights, out)
        del votes
        products = _Products(votes_and_squares)
        results.append(
            procedure(
                votes_and_squares, centre, slot_activations, uniform, beta_u, beta_a, scale, routing, children, products
            )
        )
        kept.append(products.kept)
        centres.append(centre)
    outputs = [torch.cat(parts) if len(results) > 1 else parts[0] for parts in zip(*results, strict=True)]
    return outputs, kept, centres


# _GaussianRouting's arguments: the procedure and the other non-tensor ones, then the small tensors
# (activations, beta_u, beta_a, scale), then the vote maker's inputs.
_NON_TENSOR, _SMALL = 6, 4


class _GaussianRouting(torch.autograd.Function):
    """A routing procedure, chunk by chunk of the batch, whose backward pass never holds more than a few
    vote-sized tensors of one chunk.

    Forward: for each chunk, its votes made and centred, the procedure without a graph, the products
    that read the votes kept (small: (B, Q, J, 2H) per M-step, (B, Q, J, M) per E-step) with the
    centres. Backward: for each chunk, its votes made again (on a graph to the vote maker's inputs),
    the iterations replayed on a graph of the small tensors from the kept products (:class:`_Replayed`),
    the gradient of [V' | V'^2] built from the factors the replay recorded with two batched matmuls,
    and taken back through the vote maker.
    """

    @staticmethod
    def forward(
        ctx, procedure, make_votes, shape, routing, children, batched, activations, beta_u, beta_a, scale, *inputs
    ):
        outputs, kept, centres = _forward(
            procedure, make_votes, shape, routing, children, batched, activations, beta_u, beta_a, scale, *inputs
        )
        ctx.procedure, ctx.make_votes, ctx.shape, ctx.routing, ctx.children, ctx.batched = (
            procedure,
            make_votes,
            shape,
            routing,
            children,
            batched,
        )
        ctx.kept_count = len(kept[0])
        ctx.save_for_backward(activations, beta_u, beta_a, scale, *inputs, *centres, *(t for k in kept for t in k))
        # An output the loss does not use gets None, not zeros: the responsibilities are then left out of
        # the replay's gradient instead of adding a pass of zeros.
        ctx.set_materialize_grads(False)
        if getattr(routing, "detach_responsibilities", False):
            # Constants to the backward pass by request: a loss on them alone is refused by autograd
            # ("does not require grad") instead of giving the votes a silent zero.
            ctx.mark_non_differentiable(outputs[2])
        return tuple(outputs)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_mu, grad_activations, grad_responsibilities):
        """The gradient of the poses, the activations and the responsibilities R (a loss on R: an entropy
        penalty, say) taken back through the replay."""
        given = [g for g in (grad_mu, grad_activations, grad_responsibilities) if g is not None]
        if not given:  # no output reaches the loss: nothing flows back
            return (None,) * len(ctx.needs_input_grad)
        device = given[0].device
        # As the forward pass: in float32 at least, also where backward() is called under autocast.
        with torch.autocast(device_type=device.type, enabled=False):
            return _GaussianRouting._gradients(ctx, grad_mu, grad_activations, grad_responsibilities)

    @staticmethod
    def _gradients(ctx, grad_mu, grad_activations, grad_responsibilities):
        saved = ctx.saved_tensors
        small, rest = saved[:4], saved[4:]  # activations, beta_u, beta_a, scale
        count = len(ctx.needs_input_grad) - _NON_TENSOR - _SMALL
        inputs, rest = rest[:count], rest[count:]
        given = ctx.make_votes is _given
        chunks = _chunks(small[0].shape[0], ctx.shape, small[0].dtype, given=given)
        centres, kept = rest[: len(chunks)], rest[len(chunks) :]
        needs_small = ctx.needs_input_grad[_NON_TENSOR : _NON_TENSOR + _SMALL]
        needs_inputs = ctx.needs_input_grad[_NON_TENSOR + _SMALL :]
        dtype = small[0].dtype
        small_grads = [[] for _ in small]
        input_grads = [[] for _ in inputs]
        workspace = _Workspace(small[0])
        # Votes given as a tensor: every chunk's gradient written into its part of one tensor (their leaf's
        # gradient is the gradient of the votes itself).
        full = torch.empty_like(inputs[0]) if given and needs_inputs[0] else None
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
                buffer = None if ctx.make_votes is _given else workspace.take("votes", (hi - lo, *ctx.shape))
                votes = ctx.make_votes(
                    *[t.to(dtype) for t in vote_leaves], out=None if buffer is None else buffer.view(-1)
                )
            out = workspace.take("votes_and_squares", _doubled(votes.shape))
            votes_and_squares, centre = _centred_with_squares(votes.detach(), None, out, centres[number])
            anchor = votes_and_squares.new_empty(0, requires_grad=True)
            products = _ReplayedProducts(
                votes_and_squares, list(kept[number * ctx.kept_count : (number + 1) * ctx.kept_count]), anchor
            )
            with torch.enable_grad():
                slot_activations, uniform = _uniform_assignment(votes.shape, leaves[0], ctx.children)
                mu, parent_activations, responsibilities = ctx.procedure(
                    votes_and_squares,
                    centre,
                    slot_activations,
                    uniform,
                    *leaves[1:],
                    ctx.routing,
                    ctx.children,
                    products,
                )
                wanted = [leaf for leaf in leaves if leaf.requires_grad]
                given_grads = [
                    (output, grad[lo:hi])
                    for output, grad in zip(
                        (mu, parent_activations, responsibilities),
                        (grad_mu, grad_activations, grad_responsibilities),
                        strict=True,
                    )
                    if grad is not None and output.requires_grad
                ]
                grads = (
                    torch.autograd.grad(
                        [output for output, _ in given_grads],
                        [anchor, *wanted],
                        [grad for _, grad in given_grads],
                        allow_unused=True,
                    )
                    if given_grads
                    else (None,) * (1 + len(wanted))
                )
            # The replayed graph goes now: a product it never reached still holds this chunk's votes.
            del mu, parent_activations, responsibilities
            grads = iter(grads[1:])
            for collected, leaf in zip(small_grads, leaves, strict=True):
                collected.append(next(grads) if leaf.requires_grad else None)
            if full is not None:
                _vote_gradient(votes_and_squares, *products.factors, workspace, votes, out=full[lo:hi])
                del votes_and_squares, products
            elif any(needs_inputs):
                grad_votes = _vote_gradient(votes_and_squares, *products.factors, workspace, votes)
                del votes_and_squares, products
                wanted = [leaf for leaf in vote_leaves if leaf.requires_grad]
                grads = iter(torch.autograd.grad(votes, wanted, grad_votes, allow_unused=True))
                for collected, leaf in zip(input_grads, vote_leaves, strict=True):
                    grad = next(grads) if leaf.requires_grad else None
                    # Votes given as a tensor get (a view of) the buffer back, which the next chunk reuses: a
                    # copy where there is a next chunk.
                    reused = len(chunks) > 1 and _shares_memory(grad, grad_votes)
                    collected.append(grad.clone() if reused else grad)
        small_grads = [_joined(parts, batched=i == 0) for i, parts in enumerate(small_grads)]
        if full is not None:
            input_grads = [[full]]
        input_grads = [_joined(parts, batched=i < ctx.batched) for i, parts in enumerate(input_grads)]
        return *([None] * _NON_TENSOR), *small_grads, *input_grads


def _shares_memory(tensor: torch.Tensor | None, other: torch.Tensor) -> bool:
    return tensor is not None and tensor.untyped_storage().data_ptr() == other.untyped_storage().data_ptr()


def _joined(parts: list, batched: bool):
    """The gradient of an input from its chunks' parts: concatenated along the batch, or summed."""
    if not parts or parts[0] is None:
        return None
    if batched:
        return torch.cat(parts) if len(parts) > 1 else parts[0]
    return functools.reduce(torch.add, parts)


def _vote_gradient(
    votes_and_squares, over_m: list, over_h: list, workspace: _Workspace, votes, out: torch.Tensor | None = None
) -> torch.Tensor:
    """g(V') = G[..., :H] + 2 V' * G[..., H:], G = sum_t over_m[t] (x) over_h[t] the gradient of
    [V' | V'^2] (the factor pairs the replay recorded), in ``out`` where given, else in a buffer of
    ``workspace`` laid out as ``votes`` are where they have a layout (then the vote maker's backward pass
    copies nothing).

    Large chunks take the fused form (:func:`_vote_gradient_fused`, compiled), others two batched
    matmuls, (B, Q, J, M, T) @ (B, Q, J, T, 2H), one per half, and a copy into the layout."""
    left = torch.stack(over_m, dim=-2).transpose(-1, -2)  # (B, Q, J, M, T), stacked contiguously
    right = torch.stack(over_h, dim=-2)  # (B, Q, J, T, 2H)
    in_layout = out if out is not None else workspace.take_like("grad_votes_in_layout", votes)
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
                f"EM and VB routing: compiling {self.function.__name__} failed ({type(error).__name__}: {error}); "
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
