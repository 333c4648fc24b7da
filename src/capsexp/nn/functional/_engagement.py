"""Whether routing routes: how far each child's assignment (couplings, responsibilities) is from
uniform. Its normalised entropy (:func:`responsibility_entropy`) moves little near uniform (a child that
sends 0.15 to one of ten parents and 0.094 to the others still has entropy 0.998); the measures of
:class:`Engagement` move in proportion."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from capsexp.nn.functional._gaussian_votes import _children_counts


class Engagement(NamedTuple):
    """Per child (B, children), for an assignment over P parents (P: the parents that receive the child)."""

    largest: torch.Tensor  # max_j c_ij: 1/P when uniform, 1 for a hard assignment
    kl_from_uniform: torch.Tensor  # KL(c_i || uniform) = log P - H(c_i), nats: 0 when uniform
    decided: torch.Tensor  # 1.0 where max_j c_ij > decided_threshold(P) (a child that favours a parent)


def routing_engagement(
    assignment: torch.Tensor, child_index: torch.Tensor | None = None, num_children: int | None = None
) -> Engagement:
    """:class:`Engagement` of an assignment as routers return it: (B, I, J) dense, or (B, Q, M, J) with
    ``child_index`` (Q, M) naming the child in each of a convolutional layer's window slots (EM)."""
    assignment = assignment.float()
    if child_index is None:
        assignment = shares(assignment)
    plogp = torch.special.xlogy(assignment, assignment)
    parents = assignment.shape[-1]
    if child_index is None:
        fan_out = torch.full(assignment.shape[:2], float(parents), device=assignment.device)
        largest, negative_entropy = assignment.amax(dim=-1), plogp.sum(dim=-1)
    else:
        batch, num_children = assignment.shape[0], num_children or int(child_index.max()) + 1
        flat_index = child_index.reshape(-1).expand(batch, -1)
        fan_out = (_children_counts(child_index.reshape(-1), num_children, assignment.dtype) * parents).expand(
            batch, -1
        )
        largest = assignment.new_zeros(batch, num_children).scatter_reduce(
            1, flat_index, assignment.amax(dim=-1).reshape(batch, -1), reduce="amax"
        )
        negative_entropy = plogp.new_zeros(batch, num_children).scatter_add(
            1, flat_index, plogp.sum(-1).reshape(batch, -1)
        )
    kl = torch.log(fan_out) + negative_entropy
    return Engagement(largest, kl.clamp_min(0.0), (largest > decided_threshold(fan_out)).float())


def decided_threshold(parents: torch.Tensor) -> torch.Tensor:
    """The largest coupling above which a child counts as decided among ``parents`` P: twice the uniform
    1/P, or, where that is out of reach (P = 2: 2/P = 1), halfway from uniform to a hard assignment,
    (1 + 1/P) / 2. The two agree at P = 3; for P >= 3 it is 2/P."""
    return torch.minimum(2.0 / parents, (1.0 + 1.0 / parents) / 2)


def shares(couplings: torch.Tensor) -> torch.Tensor:
    """Each child's couplings (..., J) as shares of their sum over the parents (a child that sends nothing
    keeps its zeros)."""
    return couplings / couplings.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(couplings.dtype).tiny)


def predicted_share(couplings: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
    """(B, I): the share of each child's coupling (B, I, J) that goes to its image's predicted class
    ``predicted`` (B,): 1/J when routing ignores the prediction."""
    return shares(couplings.float()).gather(-1, predicted[:, None, None].expand(-1, couplings.shape[1], 1)).squeeze(-1)


def responsibility_entropy(
    responsibilities: torch.Tensor, child_index: torch.Tensor | None = None, num_children: int | None = None
) -> torch.Tensor:
    """Entropy of each child's responsibilities over all the parents that receive it, divided by its
    maximum log(number of those parents): 1 is uniform (routing undecided), 0 is a hard assignment.

    ``responsibilities`` as :func:`~capsexp.nn.functional.em_routing` returns them: (B, I, J) dense, or
    (B, Q, M, J) with ``child_index`` (Q, M). Returns (B, children). Dense couplings that do not sum to one
    are read as shares (:func:`shares`).
    """
    if child_index is None:
        responsibilities = shares(responsibilities)
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


def image_dependence(assignment: torch.Tensor) -> torch.Tensor:
    """(B, I): how far each child's assignment (B, I, J) in one image is from the same child's in the image
    before it in the batch: the total variation distance 1/2 sum_j |c_ij - c'_ij| of their shares. 0 where
    the couplings are the same for every image (static routing), whatever they are; 1 for hard assignments
    to different parents. Beside :func:`uniform_distance`, the share of a routing's departure from
    uniform that changes with the image."""
    shared = shares(assignment.float())
    return 0.5 * (shared - shared.roll(1, dims=0)).abs().sum(dim=-1)


def uniform_distance(assignment: torch.Tensor) -> torch.Tensor:
    """(B, I): the total variation distance of each child's shares (B, I, J) from uniform, 1/2 sum_j
    |c_ij - 1/J|: 0 for uniform coupling, 1 - 1/J for a hard assignment."""
    shared = shares(assignment.float())
    return 0.5 * (shared - 1.0 / shared.shape[-1]).abs().sum(dim=-1)
