"""The spread loss on class activations (Hinton, Sabour & Frosst 2018, section 3.1)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def spread_loss(activations: torch.Tensor, targets: torch.Tensor, margin: float | torch.Tensor) -> torch.Tensor:
    """L = sum_{i != t} max(0, m - (a_t - a_i))^2 (section 3.1), averaged over the batch."""
    target_activation = activations.gather(1, targets.unsqueeze(1))
    gaps = F.relu(margin - (target_activation - activations)).pow(2)
    others = 1.0 - F.one_hot(targets, activations.shape[-1]).to(gaps.dtype)
    return (gaps * others).sum(dim=-1).mean()
