"""Max-min normalised routing (Zhao, Kleinhans, Sandhu, Patel & Unnikrishnan 2019, "Capsule Networks with
Max-Min Normalization", arXiv:1903.09662) in CapsNet's place: dynamic routing (Sabour et al. 2017,
Procedure 1) with each child's softmax over the parents replaced by a max-min normalisation of its logits,

    c_ij = lower + (upper - lower) (b_ij - min_k b_ik) / (max_k b_ik - min_k b_ik),

so that a child's couplings need not sum to one: each lies in [lower, upper], scale-free in the logits.
Where a child's logits are all equal (the first iteration, b = 0) every coupling is ``upper``. The
paper's full text was not at hand: the axis (over the parents, per child) follows its abstract ("each
lower-level capsule ... constrained only by the bounds of normalization"); the bounds and the first
iteration are this package's choices, options to change."""

import torch

from capsexp.nn.functional import Routed, squash
from max_min_routing import MaxMinRouting


def max_min_normalise(logits: torch.Tensor, lower: float, upper: float) -> torch.Tensor:
    """Each row of ``logits`` (..., J) mapped onto [lower, upper]; a row of equal logits to ``upper``."""
    low, high = logits.amin(dim=-1, keepdim=True), logits.amax(dim=-1, keepdim=True)
    spread = high - low
    scaled = torch.where(spread > 0, (logits - low) / spread.clamp_min(torch.finfo(logits.dtype).tiny), 1.0)
    return lower + (upper - lower) * scaled


def max_min_routing(votes: torch.Tensor, options: MaxMinRouting) -> Routed:
    """Parents (B, J, D) from the votes u_hat_j|i (B, I, J, D); activations |v_j|; couplings (B, I, J)."""
    logits = votes.new_zeros(votes.shape[:3])
    for iteration in range(options.iterations):
        couplings = max_min_normalise(logits, options.lower, options.upper)
        poses = squash((couplings.unsqueeze(-1) * votes).sum(dim=1))
        if iteration < options.iterations - 1:
            logits = logits + (votes * poses.unsqueeze(1)).sum(dim=-1)
    return Routed(poses, poses.norm(dim=-1), couplings)
