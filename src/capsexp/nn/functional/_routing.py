"""What every routing algorithm returns, and the controls that do not route by agreement: couplings given
(uniform, random, another image's) made parents as dynamic routing makes them.

Shapes: ``B`` batch, ``I`` child capsules, ``J`` parent capsules, ``D`` the parents' pose size. Votes
u_hat_j|i (the child's prediction of the parent's pose) have shape (B, I, J, D).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from capsexp.nn.functional._squash import squash


class Routed(NamedTuple):
    """A routing algorithm's output: the parents' poses (B, J, D) and activations (B, J) in [0, 1], and its
    assignment (B, I, J): the weight of child i's vote in parent j (couplings, responsibilities); None
    where a fused computation does not keep it."""

    poses: torch.Tensor
    activations: torch.Tensor
    assignment: torch.Tensor | None


def length(poses: torch.Tensor) -> torch.Tensor:
    """|v_j|, the activation of a squashed pose (Sabour et al. 2017, section 2): (B, J, D) -> (B, J).
    ``vector_norm``'s gradient at a zero pose is 0, not NaN."""
    return torch.linalg.vector_norm(poses, dim=-1)


def weighted_sum(couplings: torch.Tensor, votes: torch.Tensor) -> torch.Tensor:
    """s_j = sum_i c_ij u_hat_j|i: couplings (B, I, J), votes (B, I, J, D) -> (B, J, D)."""
    return torch.einsum("bij,bijd->bjd", couplings, votes)


def coupled(votes: torch.Tensor, couplings: torch.Tensor) -> Routed:
    """The parents of given couplings c_ij (B, I, J), as dynamic routing makes them: s_j = sum_i c_ij
    u_hat_j|i and v_j = squash(s_j) (Eq. 1), the activation |v_j|."""
    poses = squash(weighted_sum(couplings, votes))
    return Routed(poses, length(poses), couplings)


def shuffled_couplings(votes: torch.Tensor, couplings: torch.Tensor) -> Routed:
    """A control for input dependence: each image of the batch given the couplings (B, I, J) a routing
    found for the image before it (the batch rolled by one: the same values, the wrong image), then
    :func:`coupled`. A batch of one image keeps its own."""
    return coupled(votes, couplings.roll(1, dims=0))


def uniform_routing(votes: torch.Tensor) -> Routed:
    """No routing: every coupling c_ij = 1/J, then s_j = sum_i c_ij u_hat_j|i and v_j = squash(s_j)
    (Eq. 1), the activation |v_j|. Dynamic routing's first iteration, and its baseline in Paik et al.
    2019 ("Capsule networks need an improved routing algorithm")."""
    batch, children, parents, _ = votes.shape
    return coupled(votes, votes.new_full((batch, children, parents), 1.0 / parents))


def random_routing(votes: torch.Tensor, generator: torch.Generator | None = None) -> Routed:
    """Random couplings (Paik et al. 2019's other baseline): c_i = softmax_j(b_i) with logits
    b_ij ~ N(0, 1) drawn afresh for every example and child at every call; then as
    :func:`uniform_routing`. No gradient reaches the couplings."""
    logits = torch.randn(votes.shape[:-1], generator=generator, dtype=votes.dtype, device=votes.device)
    return coupled(votes, torch.softmax(logits, dim=-1))
