"""Batch augmentations that run on the device, vectorised over the batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as TF


def random_shift(images: torch.Tensor, max_shift: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Shift each image (B, C, H, W) by its own random (dy, dx) in [-max_shift, max_shift]^2 pixels.

    Zero padding, whole pixels: a random crop of the image padded by ``max_shift`` on every side,
    as in the CapsNet paper ("shifted by up to 2 pixels in each direction with zero padding").
    """
    if max_shift == 0:
        return images
    batch, _, height, width = images.shape
    padded = F.pad(images, (max_shift,) * 4)
    offsets = torch.randint(0, 2 * max_shift + 1, (2, batch), device=images.device, generator=generator)
    rows = offsets[0, :, None] + torch.arange(height, device=images.device)          # (B, H)
    cols = offsets[1, :, None] + torch.arange(width, device=images.device)           # (B, W)
    examples = torch.arange(batch, device=images.device)[:, None, None]
    # Advanced indexing on dims 0, 2, 3 puts them first: (B, H, W, C) -> (B, C, H, W).
    return padded[examples, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)


def rotate(images: torch.Tensor, angle: float) -> torch.Tensor:
    """Rotate a batch (B, C, H, W) by ``angle`` degrees counter-clockwise about the centre, bilinear,
    zero fill (torchvision's rotate)."""
    return TF.rotate(images, angle, interpolation=InterpolationMode.BILINEAR)
