"""Image files as uint8 tensors: one decoder for ``data=image_folder`` and for predicting on a user's
images, so that an image reaches a net exactly as the images it was trained on did.

Decoding is Pillow's, as torchvision's ``ImageFolder`` reads files (PNG, JPEG, BMP, GIF, WEBP, ...);
grey (``L``) or RGB by :meth:`PIL.Image.Image.convert`, whose RGB-to-grey is ITU-R 601-2 luma.
"""

from __future__ import annotations

import os

import numpy as np
import torch
from PIL import Image
from torchvision.datasets.folder import IMG_EXTENSIONS
from torchvision.transforms.v2 import functional as TF

IMAGE_SUFFIXES = IMG_EXTENSIONS  # the file endings taken as images, as ImageFolder takes them


def pil_mode(channels: int) -> str:
    """Pillow's mode for images of ``channels`` channels: ``L`` for grey (and each view of a stereo
    pair, 2), ``RGB`` for 3."""
    return "RGB" if channels == 3 else "L"


def decode(source: str | os.PathLike | Image.Image, mode: str) -> torch.Tensor:
    """(C, H, W) uint8: an image file or a Pillow image converted to ``mode`` (an animated image: its
    first frame). Raises Pillow's ``UnidentifiedImageError`` or ``OSError`` for a file it cannot read."""
    if isinstance(source, Image.Image):
        return _tensor(source, mode)
    with Image.open(source) as opened:
        return _tensor(opened, mode)


def _tensor(image: Image.Image, mode: str) -> torch.Tensor:
    """The pixels of ``image`` in ``mode`` (converted only where its own mode differs) as (C, H, W) uint8,
    through a NumPy array: for small images, a third of torchvision's pil_to_tensor's time."""
    pixels = torch.from_numpy(np.array(image if image.mode == mode else image.convert(mode), dtype=np.uint8))
    return pixels.unsqueeze(0) if pixels.ndim == 2 else pixels.permute(2, 0, 1).contiguous()


def square(image: torch.Tensor, size: int) -> torch.Tensor:
    """(..., C, H, W) -> (..., C, size, size): the shorter side resized to ``size`` (antialiased
    bilinear), then the centre ``size`` x ``size`` crop."""
    return TF.center_crop(TF.resize(image, size, antialias=True), size)
