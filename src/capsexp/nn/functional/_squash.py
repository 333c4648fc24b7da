"""The squash non-linearity of vector capsules (Sabour, Frosst & Hinton 2017, Eq. 1)."""

from __future__ import annotations

import torch

SQUASH_EPS = 1e-8


def squash(s: torch.Tensor, dim: int = -1, eps: float = SQUASH_EPS) -> torch.Tensor:
    """Eq. 1: v = |s|^2 / (1 + |s|^2) * s / |s|.

    ``eps`` sits inside the square root, so that s = 0 gives v = 0 with a finite gradient (a plain
    ``s / s.norm()`` is 0/0 there and its gradient NaN). |v| < 1 always.
    """
    squared_norm = s.pow(2).sum(dim=dim, keepdim=True)
    return s * (squared_norm / ((1.0 + squared_norm) * torch.sqrt(squared_norm + eps)))
