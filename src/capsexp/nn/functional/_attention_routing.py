"""Inverted dot-product attention routing (Tsai, Srivastava, Goh & Salakhutdinov, "Capsules with
Inverted Dot-Product Attention Routing", ICLR 2020, Procedure 1)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from capsexp.nn.functional._routing import Routed, weighted_sum


def attention_routing(
    votes: torch.Tensor,
    iterations: int,
    norm_weight: torch.Tensor | None = None,
    norm_bias: torch.Tensor | None = None,
    score_weight: torch.Tensor | None = None,
    score_bias: torch.Tensor | None = None,
) -> Routed:
    """Parent poses p_j (B, J, D) from votes v_ij (B, I, J, D). The parents start at p_j = 0; each of the
    ``iterations`` T >= 1 sets

    - a_ij = p_j . v_ij / sqrt(D): the agreement of child i's vote with parent j's current pose (the
      parent is the query: attention "inverted");
    - r_ij = softmax_j(a_ij): child i's routing coefficients over the parents (uniform in the first
      iteration, where p = 0);
    - p_j = LayerNorm(sum_i r_ij v_ij), with the LayerNorm's affine ``norm_weight``, ``norm_bias`` (D,);
      for D = 1 no LayerNorm, which would map every pose to its bias (the official code,
      apple/ml-capsules-inverted-attention-routing, skips it there too).

    The paper's class logit is a linear map of the final pose shared by the parents, w . p_j + b
    (``score_weight`` (D,), ``score_bias`` ()); the activation returned is its sigmoid, so that it reads
    in [0, 1] like the other algorithms' (without them, the activation is 0.5 everywhere). The
    assignment returned is the last iteration's r (B, I, J), each child's row summing to 1.
    """
    batch, children, parents, dim = votes.shape
    # Computed on votes less their mean m_j over children and dimensions (a scalar per example and parent):
    # LayerNorm drops any constant added to all of a pose's dimensions, so sum_i r_ij v_ij and
    # sum_i r_ij (v_ij - m_j) normalise to the same p_j, and p_j . v_ij = p_j . (v_ij - m_j) + m_j sum_d p_jd.
    # Votes far from zero along (1, ..., 1) compared with their spread otherwise lose float32's digits in
    # the sums the LayerNorm subtracts.
    offsets = votes.mean(dim=(1, 3), keepdim=True)  # (B, 1, J, 1)
    centred = votes - offsets

    def parent_poses(couplings: torch.Tensor) -> torch.Tensor:
        sums = weighted_sum(couplings, centred)
        if dim > 1:
            return F.layer_norm(sums, (dim,), norm_weight, norm_bias)
        return sums + offsets[:, 0] * couplings.sum(dim=1).unsqueeze(-1)  # the offsets the centring took

    couplings = votes.new_full((batch, children, parents), 1.0 / parents)
    poses = parent_poses(couplings)
    for _ in range(iterations - 1):
        agreement = torch.einsum("bjd,bijd->bij", poses, centred) + offsets.squeeze(-1) * poses.sum(-1).unsqueeze(1)
        couplings = torch.softmax(agreement / math.sqrt(dim), dim=-1)
        poses = parent_poses(couplings)
    if score_weight is None:
        scores = poses.new_zeros(batch, parents)
    else:
        scores = poses @ score_weight + (score_bias if score_bias is not None else 0.0)
    return Routed(poses, torch.sigmoid(scores), couplings)
