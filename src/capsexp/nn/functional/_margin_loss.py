"""The margin loss on capsule lengths (Sabour, Frosst & Hinton 2017, Eq. 4)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def margin_loss(
    lengths: torch.Tensor, targets: torch.Tensor, m_pos: float = 0.9, m_neg: float = 0.1, lambda_: float = 0.5
) -> torch.Tensor:
    """Eq. 4: L_k = T_k max(0, m+ - |v_k|)^2 + lambda (1 - T_k) max(0, |v_k| - m-)^2.

    Summed over the classes k, averaged over the batch. ``lengths``: (B, K) capsule lengths;
    ``targets``: (B,) class indices, or (B, T) when T objects are present in each image (MultiMNIST,
    section 6: T_k = 1 for each present class).
    """
    present = F.one_hot(targets, num_classes=lengths.shape[-1]).to(lengths.dtype)
    if targets.ndim == 2:
        present = present.amax(dim=1)
    loss = present * F.relu(m_pos - lengths).pow(2) + lambda_ * (1.0 - present) * F.relu(lengths - m_neg).pow(2)
    return loss.sum(dim=-1).mean()
