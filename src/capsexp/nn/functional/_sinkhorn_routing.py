"""Routing as entropy-regularised optimal transport (Sinkhorn-Knopp): dynamic routing whose couplings are
balanced so that every parent receives the same share of the children's mass."""

from __future__ import annotations

import math

import torch

from capsexp.config.routing_options import SinkhornRouting
from capsexp.nn.functional._capsnet import squash
from capsexp.nn.functional._routing import Routed, length, weighted_sum

# Children's masses are floored at this fraction of their mean, so that a child of mass 0 keeps a finite
# log mass (its couplings then still sum to 1, and its votes weigh nothing in the balance).
MASS_FLOOR = 1e-12


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
    Differentiated through every step by autograd.
    """
    if votes.ndim != 4 or child_masses.shape != votes.shape[:2]:
        raise ValueError(
            f"votes (B, I, J, D) and child masses (B, I) expected, got {tuple(votes.shape)} and "
            f"{tuple(child_masses.shape)}"
        )
    batch, children, parents, _ = votes.shape
    state_dtype = torch.promote_types(votes.dtype, torch.float32)  # bf16 votes: the plan in float32
    masses = child_masses.to(state_dtype)
    masses = torch.clamp(masses, min=MASS_FLOOR * masses.mean(dim=1, keepdim=True).clamp_min(MASS_FLOOR))
    log_m = (masses / masses.sum(dim=1, keepdim=True)).log().unsqueeze(-1)  # (B, I, 1)
    log_n = -math.log(parents)  # every parent's mass 1/J
    logits = votes.new_zeros(batch, children, parents, dtype=state_dtype)
    couplings = logits.new_full(logits.shape, 1.0 / parents)  # r = 1: equal costs, the plan m_i / J
    for r in range(routing.iterations):
        if r > 0:
            scaled = logits / routing.epsilon
            g = logits.new_zeros(batch, 1, parents)
            for _ in range(routing.balance_iterations):
                f = log_m - torch.logsumexp(scaled + g, dim=2, keepdim=True)
                g = log_n - torch.logsumexp(scaled + f, dim=1, keepdim=True)
            couplings = torch.softmax(scaled + g, dim=2)  # the last row step, divided by m_i
        poses = squash(weighted_sum(couplings.to(votes.dtype), votes).to(state_dtype))
        if r < routing.iterations - 1:
            logits = logits + torch.einsum("bijd,bjd->bij", votes.to(state_dtype), poses)
    poses = poses.to(votes.dtype)
    return Routed(poses, length(poses), couplings)
