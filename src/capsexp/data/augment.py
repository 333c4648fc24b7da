"""Batch augmentations that run on the device, vectorised over the batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as TF


def crop_at(images: torch.Tensor, size: int, top: torch.Tensor, left: torch.Tensor) -> torch.Tensor:
    """The ``size`` x ``size`` crop of each image (B, C, H, W) whose corner is at (top[b], left[b])."""
    rows = top[:, None] + torch.arange(size, device=images.device)  # (B, size)
    cols = left[:, None] + torch.arange(size, device=images.device)
    examples = torch.arange(images.shape[0], device=images.device)[:, None, None]
    # Advanced indexing on dims 0, 2, 3 puts them first: (B, size, size, C) -> (B, C, size, size).
    return images[examples, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)


def random_crop(images: torch.Tensor, size: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """A random ``size`` x ``size`` crop of each image (B, C, H, W), each at its own position."""
    batch, _, height, width = images.shape
    top, left = (
        torch.randint(0, extent - size + 1, (batch,), device=images.device, generator=generator)
        for extent in (height, width)
    )
    return crop_at(images, size, top, left)


def random_horizontal_flip(images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Each image (B, C, H, W) mirrored left to right with probability 1/2."""
    flip = torch.rand(images.shape[0], device=images.device, generator=generator) < 0.5
    return torch.where(flip[:, None, None, None], images.flip(-1), images)


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


def centred(images: torch.Tensor, canvas: int) -> torch.Tensor:
    """Each image (..., C, H, W) at the centre of a ``canvas`` x ``canvas`` black background (an odd
    margin puts the extra pixel after the image)."""
    height, width = images.shape[-2:]
    if canvas < max(height, width):
        raise ValueError(f"canvas={canvas} is smaller than the {height}x{width} images")
    top, left = (canvas - height) // 2, (canvas - width) // 2
    return F.pad(images, (left, canvas - width - left, top, canvas - height - top))


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


@dataclass(frozen=True)
class AffineRanges:
    """The ranges of :func:`random_affine`, each drawn uniformly per image, as capsexp takes those of
    affNIST's transformations from its page (https://www.cs.toronto.edu/~tijmen/affNIST/): rotation
    within +-20 degrees, horizontal shear within +-0.2, each axis scaled by 0.8 to 1.2, then
    translated anywhere the digit stays inside the canvas."""

    rotation: float = 20.0  # degrees, either direction
    shear: float = 0.2  # horizontal shift per pixel of height, either direction
    scale: tuple[float, float] = (0.8, 1.2)  # of each axis, independently


def random_affine(
    images: torch.Tensor,
    canvas: int,
    generator: torch.Generator | None = None,
    ranges: AffineRanges = AffineRanges(),
) -> torch.Tensor:
    """Each image (B, C, H, W) scaled, sheared and rotated about its centre by its own random affine
    map within ``ranges`` (bilinear), then placed at a random position on a ``canvas`` x ``canvas``
    black background where all its ink stays on the canvas (centred where none does).

    The digits' own 28x28 frames are not kept whole: only the ink (pixels above 0) must fit.
    """
    batch, _, height, width = images.shape
    if canvas < max(height, width):
        raise ValueError(f"canvas={canvas} is smaller than the {height}x{width} images")

    def uniform(low: float, high: float) -> torch.Tensor:
        return (
            torch.rand(batch, generator=generator, device=generator.device if generator else None) * (high - low) + low
        )

    angle = torch.deg2rad(uniform(-ranges.rotation, ranges.rotation))
    shear = uniform(-ranges.shear, ranges.shear)
    scale_x, scale_y = uniform(*ranges.scale), uniform(*ranges.scale)
    cos, sin = torch.cos(angle), torch.sin(angle)
    # forward map A = rotation @ shear @ scale, on (x, y) about the centre
    forward = torch.stack(
        [
            torch.stack([cos * scale_x, (cos * shear - sin) * scale_y], -1),
            torch.stack([sin * scale_x, (sin * shear + cos) * scale_y], -1),
        ],
        -2,
    ).to(images.device)
    # grid_sample samples the input at A^-1 (output position); the square canvas keeps the
    # normalised coordinates isotropic.
    theta = torch.cat([torch.linalg.inv(forward), torch.zeros(batch, 2, 1, device=images.device)], dim=-1)
    padded = F.pad(
        images.float(),
        ((canvas - width) // 2, (canvas - width + 1) // 2, (canvas - height) // 2, (canvas - height + 1) // 2),
    )
    grid = F.affine_grid(theta, list(padded.shape), align_corners=False)
    warped = F.grid_sample(padded, grid, mode="bilinear", padding_mode="zeros", align_corners=False)

    # Shift the ink's bounding box to a random place on the canvas: crop a canvas-sized window of the
    # warped image padded by `canvas` on every side.
    ink = warped.amax(dim=1) > 0  # (B, canvas, canvas)
    offsets = []
    for axis in (2, 1):  # rows (any ink in a row), then columns
        present = ink.any(dim=axis)
        index = torch.arange(canvas, device=images.device)
        first = torch.where(present, index, canvas).amin(dim=1)
        last = torch.where(present, index, -1).amax(dim=1)
        empty = last < first
        # the window's corner in padded coordinates: canvas - shift, shift in [-first, canvas - 1 - last]
        low, high = torch.where(empty, 0, -first), torch.where(empty, 0, canvas - 1 - last)
        draw = torch.rand(batch, generator=generator, device=generator.device if generator else None).to(images.device)
        shift = low + (draw * (high - low + 1)).long().clamp_max(high - low)
        offsets.append(canvas - shift)
    placed = crop_at(F.pad(warped, (canvas,) * 4), canvas, *offsets)
    return placed.to(images.dtype) if images.dtype.is_floating_point else placed.round().clamp(0, 255).to(images.dtype)
