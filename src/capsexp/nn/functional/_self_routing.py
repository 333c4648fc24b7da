"""Self-routing (Hahn, Pyeon & Kim, "Self-Routing Capsule Networks", NeurIPS 2019): each child routes by
its own learned weights, without agreement between votes and without iterations."""

from __future__ import annotations

import torch

from capsexp.nn.functional._routing import Routed, weighted_sum

# Guards the divisions when every child of a parent is inactive (0/0); far below any activation that counts.
SELF_ROUTING_EPS = 1e-12


def self_routing(votes: torch.Tensor, activations: torch.Tensor, logits: torch.Tensor) -> Routed:
    """Parents from the votes u_hat_j|i (B, I, J, D), the children's activations a_i (B, I) and each
    child's routing logits (B, I, J), which the layer computes from the child's own pose u_i,
    logits_ij = W^route_ij u_i + b^route_ij:

    - c_ij = softmax_j(logits_ij): child i's routing coefficients over the parents;
    - a_j = sum_i c_ij a_i / sum_i a_i: the parent's activation, the children's activations that reach
      it, as a share of all;
    - u_j = sum_i c_ij a_i u_hat_j|i / sum_i c_ij a_i: the parent's pose, the votes averaged with weights
      c_ij a_i.

    The assignment returned is c (B, I, J), each child's row summing to 1.
    """
    couplings = torch.softmax(logits, dim=-1)
    weights = couplings * activations.unsqueeze(-1)  # c_ij a_i
    weight_sums = weights.sum(dim=1)  # (B, J)
    parent_activations = weight_sums / (activations.sum(dim=1, keepdim=True) + SELF_ROUTING_EPS)
    poses = weighted_sum(weights, votes) / (weight_sums.unsqueeze(-1) + SELF_ROUTING_EPS)
    return Routed(poses, parent_activations, couplings)
