"""Self-attention routing of Efficient-CapsNet (Mazzia, Salvetti & Chiaberge, "Efficient-CapsNet: capsule
network with self-attention routing", Scientific Reports 2021)."""

from __future__ import annotations

import math

import torch

from capsexp.nn.functional._routing import Routed, length, weighted_sum

SQUASH_EPS = 1e-8  # inside the square root of |s|: s = 0 gives v = 0 with a finite gradient


def efficient_squash(s: torch.Tensor, eps: float = SQUASH_EPS) -> torch.Tensor:
    """Efficient-CapsNet's squash: v = (1 - e^(-|s|)) s / |s|. |v| < 1, and unlike Eq. 1 of Sabour et
    al. its slope at |s| = 0 is 1, not 0, so that short vectors still pass gradient."""
    norm = torch.sqrt(s.pow(2).sum(dim=-1, keepdim=True) + eps)
    return -torch.expm1(-norm) * s / norm


def efficient_routing(votes: torch.Tensor, log_priors: torch.Tensor | None = None) -> Routed:
    """Parents from the votes u_hat_j|i (B, I, J, D) in one pass, without iterations:

    - A_j = U_j U_j^T / sqrt(D), the self-attention between the votes for parent j (U_j: I x D), and
      c_ij = softmax_j(sum_k A_j,ik): child i's coupling to parent j, how well its vote agrees with all
      the votes for j (sum_k u_hat_j|i . u_hat_j|k = u_hat_j|i . sum_k u_hat_j|k);
    - s_j = sum_i (c_ij + b_ij) u_hat_j|i, with the learned log priors b (I, J) (zero: none);
    - v_j = (1 - e^(-|s_j|)) s_j / |s_j| (:func:`efficient_squash`), the activation |v_j|.

    The assignment returned is c (B, I, J), each child's row summing to 1; the priors b, shared by all
    inputs, are the layer's parameters.
    """
    agreement = torch.einsum("bijd,bjd->bij", votes, votes.sum(dim=1)) / math.sqrt(votes.shape[-1])
    couplings = torch.softmax(agreement, dim=-1)
    weights = couplings if log_priors is None else couplings + log_priors
    poses = efficient_squash(weighted_sum(weights, votes))
    return Routed(poses, length(poses), couplings)
