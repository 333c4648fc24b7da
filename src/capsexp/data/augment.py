"""Batch augmentations that run on the device, vectorised over the batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as TF


def random_crop(images: torch.Tensor, size: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """A random ``size`` x ``size`` crop of each image (B, C, H, W), each at its own position."""
    batch, _, height, width = images.shape
    offsets = [
        torch.randint(0, extent - size + 1, (batch,), device=images.device, generator=generator)
        for extent in (height, width)
    ]
    rows = offsets[0][:, None] + torch.arange(size, device=images.device)  # (B, size)
    cols = offsets[1][:, None] + torch.arange(size, device=images.device)
    examples = torch.arange(batch, device=images.device)[:, None, None]
    # Advanced indexing on dims 0, 2, 3 puts them first: (B, size, size, C) -> (B, C, size, size).
    return images[examples, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)


def center_crop(images: torch.Tensor, size: int) -> torch.Tensor:
    top, left = (images.shape[-2] - size) // 2, (images.shape[-1] - size) // 2
    return images[..., top : top + size, left : left + size]


def random_shift(images: torch.Tensor, max_shift: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Shift each image (B, C, H, W) by its own random (dy, dx) in [-max_shift, max_shift]^2 pixels.

    Zero padding, whole pixels: a random crop of the image padded by ``max_shift`` on every side,
    as in the CapsNet paper ("shifted by up to 2 pixels in each direction with zero padding").
    """
    if max_shift == 0:
        return images
    return random_crop(F.pad(images, (max_shift,) * 4), images.shape[-1], generator)


def random_placement(images: torch.Tensor, canvas: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Each image (B, C, H, W) at its own random position on a ``canvas`` x ``canvas`` black background,
    every position that keeps it whole equally likely: a random crop of the image padded by
    ``canvas - H`` on every side (each such crop holds the whole image)."""
    height, width = images.shape[-2:]
    if canvas < max(height, width):
        raise ValueError(f"canvas={canvas} is smaller than the {height}x{width} images")
    return random_crop(
        F.pad(images, (canvas - width, canvas - width, canvas - height, canvas - height)), canvas, generator
    )


def random_brightness_contrast(
    images: torch.Tensor, max_delta: float, contrast: tuple[float, float], generator: torch.Generator | None = None
) -> torch.Tensor:
    """Per image: add a brightness offset in [-max_delta, max_delta], then scale each channel's
    deviation from its mean by a factor in ``contrast`` (as ``tf.image.random_brightness`` and
    ``random_contrast``)."""
    batch = images.shape[0]
    shape = (batch,) + (1,) * (images.ndim - 1)
    delta = (torch.rand(shape, device=images.device, generator=generator) * 2 - 1) * max_delta
    factor = torch.empty(shape, device=images.device).uniform_(*contrast, generator=generator)
    images = images + delta
    mean = images.mean(dim=(-2, -1), keepdim=True)
    return (images - mean) * factor + mean


def standardize(images: torch.Tensor) -> torch.Tensor:
    """Per-image standardisation over all its pixels and channels: (x - mean) / max(std, 1/sqrt(n)),
    as ``tf.image.per_image_standardization``."""
    flat = images.flatten(1)
    mean = flat.mean(dim=1)
    std = flat.std(dim=1, unbiased=False).clamp_min(1.0 / flat.shape[1] ** 0.5)
    shape = (-1,) + (1,) * (images.ndim - 1)
    return (images - mean.view(shape)) / std.view(shape)


def rotate(images: torch.Tensor, angle: float) -> torch.Tensor:
    """Rotate a batch (B, C, H, W) by ``angle`` degrees counter-clockwise about the centre, bilinear,
    zero fill (torchvision's rotate)."""
    return TF.rotate(images, angle, interpolation=InterpolationMode.BILINEAR)
