"""Dynamic routing (Sabour, Frosst & Hinton 2017, "Dynamic Routing Between Capsules", Procedure 1): on
given votes, and fused with the votes of a fully connected layer, each with its backward pass written out.

Shapes: ``B`` batch, ``I`` input (child) capsules, ``J`` output (parent) capsules, ``D`` output
capsule dimension. ``votes`` are the prediction vectors u_hat_{j|i} = W_ij u_i, shape (B, I, J, D).
"""

from __future__ import annotations

import itertools
import math
import threading
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from capsexp.config.routing_options import DynamicRouting
from capsexp.nn.functional._exporting import exporting
from capsexp.nn.functional._squash import squash

_scratch_buffers = threading.local()


def _scratch(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor for a temporary that never leaves the function that asks for it.

    On the CPU, a fresh buffer the size of the votes (94 MB for CapsNet at batch 128) costs the kernel's
    page faults on its first write each step, more than the arithmetic written into it. So the CPU
    keeps one buffer per thread and dtype, grown to the largest size asked for and reused; each
    caller must be done with it before the next call. Elsewhere (CUDA's caching allocator already
    reuses memory) and while torch.compile traces, a plain ``new_empty``.
    """
    if like.device.type != "cpu" or torch.compiler.is_compiling():
        return like.new_empty(shape)
    numel = math.prod(shape)
    buffers = _scratch_buffers.__dict__.setdefault("by_dtype", {})
    buffer = buffers.get(like.dtype)
    if buffer is None or buffer.numel() < numel:
        del buffer  # the smaller buffer is freed before the larger one is made
        buffers.pop(like.dtype, None)
        # A normal tensor even when first asked for under inference mode (a test-only run): an
        # inference tensor could not be written outside it (training, attacks) afterwards.
        with torch.inference_mode(False):
            buffer = buffers[like.dtype] = torch.empty(numel, dtype=like.dtype)
    return buffer[:numel].view(shape)


def dynamic_routing(
    votes: torch.Tensor,
    routing: DynamicRouting = DynamicRouting(),
    return_couplings: bool = False,
    bias: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Procedure 1 (routing-by-agreement): parent capsules v (B, J, D) from votes (B, I, J, D).

    For every example the routing logits start at b = 0; each iteration sets
    c_i = softmax(b_i) over the parents j, s_j = sum_i c_ij u_hat_j|i, v_j = squash(s_j) and, except
    after the last, b_ij += u_hat_j|i . v_j (times ``routing.logit_scale``, 1 in the paper).

    Args:
        votes: u_hat, shape (B, I, J, D). Laid out in memory as (B, J, I, D) (i.e. a
            ``transpose(1, 2)`` view of a contiguous tensor, as :class:`~capsexp.nn.RoutingCapsules`
            makes them), the routing sums are contiguous matrix-vector products and no copy is made.
        routing: the options (:class:`~capsexp.nn.DynamicRouting`, checked when built; its defaults
            are the paper's): ``iterations`` r >= 1 (the paper uses 3), and ``detach_agreement``: if
            false (the paper, and the official code), the loss differentiates through the agreement
            updates b += u_hat . v, so the couplings themselves learn; if true, the couplings are
            constants in the backward pass and gradients reach the votes only through the last
            s_j = sum_i c_ij u_hat_j|i (as some public ports do); cheaper. ``none_of_the_above``: the
            routing softmax over the J parents and one more whose logit stays 0, which takes its share
            of each child's coupling and is then dropped (section 7's CIFAR-10 models; the official
            code's leaky routing): c_ij = exp(b_ij) / (1 + sum_k exp(b_ik)), summing to less than 1.
            ``logit_scale`` lambda: b_ij += lambda u_hat_j|i . v_j, the routing softmax's inverse
            temperature.
        return_couplings: also return the last coupling coefficients c, shape (B, I, J).
        bias: (J, D) added to every iteration's s_j before its squash, as the official code adds its
            learned biases (``_update_routing`` in the authors' ``research/capsules``); None: the paper's
            Procedure 1, without.

    The backward pass is written out (derivation in ``_routing_gradient_factors``), not left to autograd:
    the gradient of the votes is a sum of 2r - 1 outer products, written into one tensor by one batched
    matmul, instead of autograd's one full-size tensor per use of the votes.
    """
    if votes.ndim != 4:
        raise ValueError(f"votes must have shape (batch, in_caps, out_caps, out_dim), got {tuple(votes.shape)}")
    # (B, J, I, D): per (example, parent), the votes of all children form one I x D matrix.
    parent_major_votes = votes.transpose(1, 2)
    if not parent_major_votes.is_contiguous():
        parent_major_votes = parent_major_votes.contiguous()
    if exporting():  # Procedure 1's forward alone, which the exporters trace
        all_couplings, _, all_parents = _route(parent_major_votes, routing, bias)
        parents, couplings = all_parents[-1].to(votes.dtype), all_couplings[-1]
    else:
        parents, couplings = _DynamicRouting.apply(parent_major_votes, bias, routing)
    if return_couplings:
        return parents, couplings.transpose(1, 2)
    return parents


def _route(
    votes: torch.Tensor, routing: DynamicRouting, bias: torch.Tensor | None = None
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Procedure 1 on parent-major votes (B, J, I, D); returns every iteration's c, s and v (s with the
    ``bias`` (J, D) added, where given).

    c: (B, J, I), s and v: (B, J, D). Sums over children are batched matrix-vector products. With
    ``none_of_the_above``, the softmax also covers a parent of logit 0 that is dropped; the backward pass
    is the same (its Jacobian dc_j / db_k = c_j (delta_jk - c_k) keeps the form of the softmax's).
    """
    iterations, none_of_the_above, scale = routing.iterations, routing.none_of_the_above, routing.logit_scale
    batch, num_parents, num_children, _ = votes.shape
    # The routing state (b, c, s, v) is small: keep it at least float32 when the votes are half/bf16.
    state_dtype = torch.promote_types(votes.dtype, torch.float32)
    logits = votes.new_zeros(batch, num_parents, num_children, dtype=state_dtype)  # b_ij = 0
    couplings, totals, parents = [], [], []
    for r in range(iterations):
        if r == 0:  # softmax of zero logits: exactly uniform, no need to compute it
            c = logits.new_full(logits.shape, 1.0 / (num_parents + int(none_of_the_above)))
        elif none_of_the_above:
            c = torch.softmax(F.pad(logits, (0, 0, 0, 1)), dim=1)[:, :num_parents]  # the extra parent's b = 0
        else:
            c = torch.softmax(logits, dim=1)  # over parents j
        s = torch.matmul(c.to(votes.dtype).unsqueeze(2), votes).squeeze(2).to(state_dtype)  # s_j = sum_i c_ij u_hat_j|i
        if bias is not None:  # the official code's s_j + b_j
            s = s + bias.to(state_dtype)
        v = squash(s)  # v_j = squash(s_j)
        couplings.append(c), totals.append(s), parents.append(v)
        if r < iterations - 1:
            agreement = _dot_each_child(votes, v)
            logits = logits + scale * agreement.to(state_dtype)  # b_ij += u_hat_j|i . v_j (times the scale)
    return couplings, totals, parents


class RoutingTrace(NamedTuple):
    """What each routing iteration did (for inspection: not differentiable)."""

    couplings: torch.Tensor  # (R, B, I, J): c_ij used by iteration r
    logit_changes: torch.Tensor  # (R,): mean |s u_hat_j|i . v_j^(r)|, the change of b_ij made after iteration r
    update_changes: torch.Tensor  # (R - 1,): mean |s u_hat_j|i . (v_j^(r) - v_j^(r-1))| for r = 2 .. R
    coupling_changes: torch.Tensor  # (R - 1,): mean |c_ij^(r) - c_ij^(r-1)| for r = 2 .. R


@torch.no_grad()
def dynamic_routing_trace(
    votes: torch.Tensor, routing: DynamicRouting = DynamicRouting(), bias: torch.Tensor | None = None
) -> RoutingTrace:
    """Procedure 1 on votes (B, I, J, D) as :func:`dynamic_routing` runs it, recording every
    iteration's couplings and three measures of how routing settles (means over images, children
    and parents):

    - the absolute change of the routing logits b_ij that iteration r's agreement update makes
      (including the update after the last iteration, which Procedure 1 performs but whose result
      is not used): the agreement times ``routing.logit_scale`` s, as the logits move. It tends to
      s u_hat . v*, not to 0, as the parents settle on v*.
    - the absolute difference between iteration r's update and iteration r - 1's: 0 once the
      parents no longer move, so it falls as routing converges (Appendix A reports a logit change
      that falls log-linearly with the iterations: this is the logit change that can).
    - the absolute change of the couplings c_ij from iteration r - 1 to r.
    """
    parent_major = votes.transpose(1, 2).contiguous()
    couplings, _, parents = _route(parent_major, routing, bias)
    agreements = [routing.logit_scale * _dot_each_child(parent_major, v) for v in parents]
    logit_changes = torch.stack([a.abs().mean() for a in agreements])
    none = logit_changes.new_zeros(0)
    updates = [(a - previous).abs().mean() for previous, a in itertools.pairwise(agreements)]
    steps = [(c - previous).abs().mean() for previous, c in itertools.pairwise(couplings)]
    return RoutingTrace(
        torch.stack(couplings).transpose(2, 3),
        logit_changes.float(),
        torch.stack(updates).float() if updates else none,
        torch.stack(steps).float() if steps else none,
    )


def _dot_each_child(votes: torch.Tensor, parent_vectors: torch.Tensor) -> torch.Tensor:
    """u_hat_j|i . x_j for every child i: (B, J, I, D), (B, J, D) -> (B, J, I).

    Written x^T U^T rather than U x: BLAS runs the (1 x D) @ (D x I) product about 3x faster here.
    """
    return torch.matmul(parent_vectors.to(votes.dtype).unsqueeze(2), votes.transpose(-1, -2)).squeeze(2)


def _routing_gradient_factors(
    votes: torch.Tensor,
    saved: tuple[torch.Tensor, ...],
    grad_parents: torch.Tensor | None,
    routing: DynamicRouting,
    grad_couplings: torch.Tensor | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """Reverse Procedure 1: the gradient of the parent-major votes as a sum of outer products.

    With g(x) = dL/dx, going back over r = R..1:

        g(v_r)   = g(output)                        if r = R
                 = sum_i g(a_ir) u_hat_i            otherwise (a_r = u_hat . v_r; lambda a_r was added to b_{r+1})
        g(s_r)   = squash'(s_r)^T g(v_r)
        g(c_r)   = u_hat . g(s_r)                   (per child i and parent j), plus at r = R the loss's
                                                    own g(c_R) (``grad_couplings``: a loss on the couplings)
        g(b_r)   = g(b_{r+1}) + softmax'(c_r)^T g(c_r)     (c_1 is constant: b_1 = 0)
        g(a_r)   = lambda g(b_{r+1})               (lambda: the routing's logit_scale)
        g(u_hat) = sum_r c_r (x) g(s_r) + sum_{r<R} g(a_r) (x) v_r

    Returns the factors of the last line: ``left`` terms of shape (B, J, I), ``right`` of (B, J, D), and
    sum_r g(s_r) (B, J, D): the gradient of a bias added to every s_r. With ``detach_agreement`` only the
    last iteration's c_R (x) g(s_R) remains (and g(s_R) for the bias).
    """
    iterations, detach_agreement = len(saved) // 3, routing.detach_agreement
    couplings, totals, parents = saved[:iterations], saved[iterations : 2 * iterations], saved[2 * iterations :]
    state_dtype = totals[0].dtype
    grad_v = torch.zeros_like(parents[-1]) if grad_parents is None else grad_parents.to(state_dtype)
    grad_logits = None  # g(b_{r+1})
    left, right = [], []
    grad_totals = None  # sum_r g(s_r)
    for r in [iterations - 1] if detach_agreement else range(iterations - 1, -1, -1):
        if r < iterations - 1:
            grad_agreement = grad_logits * routing.logit_scale
            grad_v = torch.matmul(grad_agreement.to(votes.dtype).unsqueeze(2), votes).squeeze(2).to(state_dtype)
            left.append(grad_agreement), right.append(parents[r])
        with torch.enable_grad():
            total = totals[r].detach().requires_grad_()
            (grad_s,) = torch.autograd.grad(squash(total), total, grad_v)
        left.append(couplings[r]), right.append(grad_s)
        grad_totals = grad_s if grad_totals is None else grad_totals + grad_s
        if r > 0 and not detach_agreement:
            grad_c = _dot_each_child(votes, grad_s).to(state_dtype)
            if r == iterations - 1 and grad_couplings is not None:
                grad_c = grad_c + grad_couplings.to(state_dtype)
            c = couplings[r]
            grad_b = c * (grad_c - (grad_c * c).sum(dim=1, keepdim=True))  # softmax over the parents
            grad_logits = grad_b if grad_logits is None else grad_logits + grad_b
    return left, right, grad_totals


class _DynamicRouting(torch.autograd.Function):
    """Routing on parent-major votes (B, J, I, D), with the backward pass written out."""

    @staticmethod
    def forward(ctx, votes: torch.Tensor, bias: torch.Tensor | None, routing: DynamicRouting):
        # Autocast off: the votes keep the dtype they come in, the small routing state is float32.
        with torch.autocast(device_type=votes.device.type, enabled=False):
            couplings, totals, parents = _route(votes, routing, bias)
        ctx.routing, ctx.bias_dtype = routing, None if bias is None else bias.dtype
        ctx.save_for_backward(votes, *couplings, *totals, *parents)
        # The first iteration's couplings are uniform, and detach_agreement makes every iteration's constants
        # to the backward pass: then a loss on them alone is refused by autograd ("does not require grad")
        # instead of giving the votes a silent zero.
        if routing.iterations == 1 or routing.detach_agreement:
            ctx.mark_non_differentiable(couplings[-1])
        ctx.set_materialize_grads(False)  # a loss on the poses alone: no pass of zeros for the couplings
        return parents[-1].to(votes.dtype), couplings[-1]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_parents: torch.Tensor | None, grad_couplings: torch.Tensor | None):
        """The votes' (and the bias's) gradient of a loss on the parents and, where it uses them, on the
        last couplings returned (an entropy penalty, say)."""
        votes, *saved = ctx.saved_tensors
        if grad_parents is None and grad_couplings is None:
            return None, None, None
        with torch.autocast(device_type=votes.device.type, enabled=False):
            left, right, grad_totals = _routing_gradient_factors(
                votes, saved, grad_parents, ctx.routing, grad_couplings
            )
            # (B, J, I, T) @ (B, J, T, D) -> (B, J, I, D): every term written in one pass (the left factors stacked
            # as (B, J, T, I), a contiguous copy, and read transposed by the product).
            grad_votes = torch.matmul(
                torch.stack(left, dim=-2).to(votes.dtype).transpose(-1, -2), torch.stack(right, dim=-2).to(votes.dtype)
            )
        grad_bias = None if ctx.bias_dtype is None else grad_totals.sum(dim=0).to(ctx.bias_dtype)
        return grad_votes, grad_bias, None


def fully_connected_routing(
    inputs: torch.Tensor,
    weight: torch.Tensor,
    out_caps: int,
    routing: DynamicRouting = DynamicRouting(),
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Votes u_hat_j|i = W_ij u_i, then :func:`dynamic_routing` (with its ``bias``, where given): a
    DigitCaps layer in one call.

    ``inputs`` (B, I, in_dim); ``weight`` (I, in_dim, out_caps * out_dim), W_ij = weight[i, :, j].T;
    returns the parents (B, out_caps, out_dim). Same result as
    ``dynamic_routing(votes, routing)``, but fused: the backward pass writes the gradient of the
    votes straight into the layout of the vote matmul, (I, B, J*D), where the input and weight gradients
    are plain batched matmuls (autograd would permute a second full-size copy of it).
    """
    # In float32 at least, under autocast too: the votes are a few MFLOPs per image, the routing's sums
    # over them batched matrix-vector products, and bf16 ones took the CPU's slow paths (bf16 votes
    # made a capsnet_small training step slower, docs/speed.md).
    dtype = torch.promote_types(torch.result_type(inputs, weight), torch.float32)
    return _VotesAndRouting.apply(inputs.to(dtype), weight.to(dtype), bias, out_caps, routing)


class _VotesAndRouting(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        inputs: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        num_parents: int,
        routing: DynamicRouting,
    ):
        num_children, batch = weight.shape[0], inputs.shape[0]
        with torch.autocast(device_type=inputs.device.type, enabled=False):
            child_major = _scratch((num_children, batch, weight.shape[2]), inputs)
            torch.bmm(inputs.transpose(0, 1), weight, out=child_major)  # (I, B, J*D)
            # Parent-major (B, J, I, D): each routing sum becomes a contiguous matrix-vector product.
            votes = child_major.view(num_children, batch, num_parents, -1).permute(1, 2, 0, 3).contiguous()
            couplings, totals, parents = _route(votes, routing, bias)
        ctx.routing, ctx.bias_dtype = routing, None if bias is None else bias.dtype
        ctx.save_for_backward(inputs, weight, votes, *couplings, *totals, *parents)
        return parents[-1].to(votes.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_parents: torch.Tensor):
        inputs, weight, votes, *saved = ctx.saved_tensors
        num_children, batch = weight.shape[0], inputs.shape[0]
        with torch.autocast(device_type=inputs.device.type, enabled=False):
            left, right, grad_totals = _routing_gradient_factors(votes, saved, grad_parents, ctx.routing)
            # The terms are summed in the routing's float32, the factors' dtype, and cast once for the
            # matmuls below: under bf16 autocast a bf16 sum with broadcasting took the CPU's slow path
            # (its addcmul_ 7.5x float32's), more than the bf16 convolutions saved.
            grad_votes = _scratch((num_children, *votes.shape[:2], votes.shape[3]), left[0])  # (I, B, J, D)
            for term, (child_factor, parent_factor) in enumerate(zip(left, right, strict=True)):  # 2r - 1 terms at most
                child_factor = child_factor.permute(2, 0, 1).unsqueeze(-1)  # (I, B, J, 1)
                parent_factor = parent_factor.unsqueeze(0)  # (1, B, J, D)
                if term == 0:
                    torch.mul(child_factor, parent_factor, out=grad_votes)
                else:
                    grad_votes.addcmul_(child_factor, parent_factor)
            grad_votes = grad_votes.view(num_children, batch, -1).to(votes.dtype)  # (I, B, J*D)
            grad_inputs = grad_weight = None
            if ctx.needs_input_grad[0]:
                grad_inputs = torch.bmm(grad_votes, weight.transpose(1, 2)).transpose(0, 1)
            if ctx.needs_input_grad[1]:
                grad_weight = torch.bmm(inputs.transpose(0, 1).transpose(1, 2), grad_votes)
        grad_bias = None if ctx.bias_dtype is None else grad_totals.sum(dim=0).to(ctx.bias_dtype)
        return grad_inputs, grad_weight, grad_bias, None, None
