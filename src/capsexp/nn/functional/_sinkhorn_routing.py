"""Routing as entropy-regularised optimal transport (Sinkhorn-Knopp): dynamic routing whose couplings are
balanced so that every parent receives the same share of the children's mass."""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from capsexp.config.routing_options import SinkhornRouting
from capsexp.nn.functional._exporting import exporting
from capsexp.nn.functional._routing import Routed, length
from capsexp.nn.functional._squash import squash

# Children's masses are floored at this fraction of their mean, so that a child of mass 0 keeps a finite
# log mass (its couplings then still sum to 1, and its votes weigh nothing in the balance).
MASS_FLOOR = 1e-12
# The balance runs in the scaling domain while every parent's kernel column holds an entry above this (a
# parent within about 40 nats of some child's best, in float32), and in the log domain otherwise.
KERNEL_FLOOR = 1e-18


def sinkhorn_routing(
    votes: torch.Tensor, child_masses: torch.Tensor, routing: SinkhornRouting = SinkhornRouting()
) -> Routed:
    """Parents (B, J, D) from votes u_hat_j|i (B, I, J, D) and the children's masses a_i (B, I) (their
    activations or lengths).

    Each iteration r = 1 .. R, with routing logits b_ij = 0 at r = 1:

    - the transport plan P (I x J) of least cost sum_ij -b_ij P_ij minus eps times its entropy, whose
      rows carry the children's masses m_i = a_i / sum_k a_k and whose columns give each parent the same
      mass 1/J: P_ij = exp(b_ij / eps + f_i + g_j), with potentials f, g found by ``balance_iterations``
      alternating Sinkhorn-Knopp steps in the log domain,

          f_i = log m_i - logsumexp_j(b_ij / eps + g_j),   g_j = log(1/J) - logsumexp_i(b_ij / eps + f_i),

      from g = 0, then one last step of f, so that every child's row is exact;
    - the couplings c_ij = P_ij / m_i = softmax_j(b_ij / eps + g_j): each child's share of its own mass
      (summing to 1 over the parents); the column sums sum_i m_i c_ij tend to 1/J with the steps;
    - s_j = sum_i c_ij u_hat_j|i, v_j = squash(s_j) (Eq. 1), and, except after the last,
      b_ij += u_hat_j|i . v_j: the agreement with the current parents (the negative cost), as
      dynamic routing updates its logits.

    With eps = 1 and the parent potentials g left at 0 this is Procedure 1 of Sabour et al. 2017: the
    column balance is all that differs, and it lets no parent take every child. At r = 1 the costs are
    equal and the plan is m_i / J: uniform couplings. Activations |v_j|; the assignment returned is c.
    The backward pass is written out (:class:`_SinkhornRouting`): one vote-sized gradient, the balance and
    squash differentiated by autograd on their small tensors.
    """
    if votes.ndim != 4 or child_masses.shape != votes.shape[:2]:
        raise ValueError(
            f"votes (B, I, J, D) and child masses (B, I) expected, got {tuple(votes.shape)} and "
            f"{tuple(child_masses.shape)}"
        )
    state_dtype = torch.promote_types(votes.dtype, torch.float32)  # bf16 votes: the plan in float32
    masses = child_masses.to(state_dtype)
    masses = torch.clamp(masses, min=MASS_FLOOR * masses.mean(dim=1, keepdim=True).clamp_min(MASS_FLOOR))
    log_m = (masses / masses.sum(dim=1, keepdim=True)).log().unsqueeze(1)  # (B, 1, I)
    parent_major = votes.transpose(1, 2)  # (B, J, I, D): each routing sum a contiguous product
    if not parent_major.is_contiguous():
        parent_major = parent_major.contiguous()
    with torch.autocast(device_type=votes.device.type, enabled=False):
        if exporting() or not torch.is_grad_enabled():  # the procedure alone, which the exporters trace
            poses, couplings = _route(parent_major, log_m, routing)[-1][2:]
        else:
            poses, couplings = _SinkhornRouting.apply(parent_major, log_m, routing)
    poses = poses.to(votes.dtype)
    return Routed(poses, length(poses), couplings.transpose(1, 2))


def _balance(logits: torch.Tensor, log_m: torch.Tensor, routing: SinkhornRouting) -> torch.Tensor:
    """The couplings c (B, J, I) of the plan for logits b (B, J, I) and log masses (B, 1, I): Sinkhorn-Knopp's
    alternating steps, on the children's potentials first, from the parents' at 0.

    In the scaling domain (Sinkhorn & Knopp's own form) where it is safe: the kernel K = exp(b / eps), each
    child's row divided by its largest entry, and scalings u = exp(f), w = exp(g) fitted by products with K:
    one exponential per call instead of one per step. Where some parent's kernel column underflows (its
    logits tens of nats below every child's best: huge votes), in the log domain, whose steps are exact
    there: f_i = log m_i - logsumexp_j(b_ij / eps + g_j), g_j = log(1/J) - logsumexp_i(b_ij / eps + f_i)."""
    scaled = logits / routing.epsilon
    parents = logits.shape[1]
    kernel = torch.exp(scaled - scaled.amax(dim=1, keepdim=True))  # each child's largest entry 1
    if exporting() or kernel.amax(dim=2).amin() > KERNEL_FLOOR:
        masses = log_m.exp()  # (B, 1, I)
        w = kernel.new_ones(logits.shape[0], 1, parents)
        for _ in range(routing.balance_iterations):
            u = masses / torch.matmul(w, kernel)  # (B, 1, I): u_i = m_i / sum_j K_ij w_j
            w = (1.0 / parents) / torch.matmul(kernel, u.transpose(1, 2)).transpose(1, 2)  # (B, 1, J)
        couplings = kernel * w.transpose(1, 2)
        couplings = couplings / couplings.sum(dim=1, keepdim=True)  # the last row step, divided by m_i
        if exporting() or torch.isfinite(couplings).all():
            return couplings
    log_n = -math.log(parents)  # every parent's mass 1/J
    g = logits.new_zeros(logits.shape[0], parents, 1)
    for _ in range(routing.balance_iterations):
        f = log_m - torch.logsumexp(scaled + g, dim=1, keepdim=True)
        g = log_n - torch.logsumexp(scaled + f, dim=2, keepdim=True)
    return torch.softmax(scaled + g, dim=1)


def _route(
    votes: torch.Tensor, log_m: torch.Tensor, routing: SinkhornRouting
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The iterations on parent-major votes (B, J, I, D): per iteration (b_r, s_r, v_r, c_r), the logits
    (B, J, I), the total input and the parents (B, J, D), and the couplings (B, J, I)."""
    batch, parents, children, _ = votes.shape
    state_dtype = log_m.dtype
    logits = votes.new_zeros(batch, parents, children, dtype=state_dtype)
    couplings = logits.new_full(logits.shape, 1.0 / parents)  # r = 1: equal costs, the plan m_i / J
    found = []
    for r in range(routing.iterations):
        if r > 0:
            couplings = _balance(logits, log_m, routing)
        total = torch.matmul(couplings.to(votes.dtype).unsqueeze(2), votes).squeeze(2).to(state_dtype)
        poses = squash(total)
        found.append((logits, total, poses, couplings))
        if r < routing.iterations - 1:  # b_ij += u_hat_j|i . v_j
            logits = logits + torch.matmul(votes, poses.to(votes.dtype).unsqueeze(-1)).squeeze(-1).to(state_dtype)
    return found


class _SinkhornRouting(torch.autograd.Function):
    """The iterations with the backward pass written out, as dynamic routing's (``_dynamic_routing.py``): the gradient
    of the votes is a sum of outer products written in one product, instead of one vote-sized tensor per
    use of the votes; the small steps (the balance, squash) are differentiated by autograd on the spot."""

    @staticmethod
    def forward(ctx, votes: torch.Tensor, log_m: torch.Tensor, routing: SinkhornRouting):
        found = _route(votes, log_m, routing)
        ctx.routing = routing
        ctx.save_for_backward(votes, log_m, *(t for step in found for t in step))
        _, _, poses, couplings = found[-1]
        return poses, couplings

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_poses: torch.Tensor | None, grad_couplings: torch.Tensor | None):
        """Going back over r = R..1, with g(x) = dL/dx: g(v_r) = g(output) at r = R, else sum_i g(a_ir) u_hat_i;
        g(s_r) = squash'(s_r)^T g(v_r); g(c_r) = u_hat . g(s_r), plus the loss's own g(c_R) at r = R (a loss
        on the couplings returned: an entropy penalty, say); g(b_r) and g(log m) through the balance, plus
        g(b_{r+1}); g(a_{r-1}) = g(b_r); g(u_hat) = sum_r c_r (x) g(s_r) + sum_{r<R} g(a_r) (x) v_r."""
        votes, log_m, *saved = ctx.saved_tensors
        steps = [saved[i : i + 4] for i in range(0, len(saved), 4)]
        grad_log_m = torch.zeros_like(log_m)
        grad_next = None  # g(b_{r+1})
        last_poses = steps[-1][2]
        grad_v = torch.zeros_like(last_poses) if grad_poses is None else grad_poses.to(log_m.dtype)
        left, right = [], []
        for r in range(len(steps) - 1, -1, -1):
            logits, total, poses, couplings = steps[r]
            if grad_next is not None:  # v_r made a_r = u_hat . v_r, added to b_{r+1}
                grad_v = torch.matmul(grad_next.to(votes.dtype).unsqueeze(2), votes).squeeze(2).to(log_m.dtype)
                left.append(grad_next), right.append(poses)
            with torch.enable_grad():
                total = total.detach().requires_grad_()
                (grad_s,) = torch.autograd.grad(squash(total), total, grad_v)
            left.append(couplings), right.append(grad_s)
            if r == 0:  # c_1 is uniform: nothing flows further
                break
            grad_c = torch.matmul(votes, grad_s.to(votes.dtype).unsqueeze(-1)).squeeze(-1).to(log_m.dtype)
            if r == len(steps) - 1 and grad_couplings is not None:
                grad_c = grad_c + grad_couplings.to(log_m.dtype)
            with torch.enable_grad():
                inputs = (logits.detach().requires_grad_(), log_m.detach().requires_grad_())
                grad_logits, grad_masses = torch.autograd.grad(_balance(*inputs, ctx.routing), inputs, grad_c)
            grad_log_m += grad_masses
            grad_next = grad_logits if grad_next is None else grad_logits + grad_next
        # (B, J, I, T) @ (B, J, T, D) -> (B, J, I, D): every term written in one pass (the left factors
        # stacked as (B, J, T, I), a contiguous copy, and read transposed by the product).
        grad_votes = torch.matmul(
            torch.stack(left, dim=-2).to(votes.dtype).transpose(-1, -2), torch.stack(right, dim=-2).to(votes.dtype)
        )
        return grad_votes, grad_log_m, None
