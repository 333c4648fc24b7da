"""Image files as uint8 tensors: one decoder for ``data=image_folder`` and for predicting on a user's
images, so that an image reaches a net exactly as the images it was trained on did.

Decoding is Pillow's, as torchvision's ``ImageFolder`` reads files (PNG, JPEG, BMP, GIF, WEBP, TIFF, ...),
with what a person's files need beside it (:func:`read_image`); grey (``L``) or RGB by
:meth:`PIL.Image.Image.convert`, whose RGB-to-grey is ITU-R 601-2 luma.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from PIL import Image

from capsexp.data import page

if TYPE_CHECKING:  # torch and torchvision are imported where used: listing files needs neither
    import torch

# The file endings taken as images: those of torchvision's ImageFolder (its IMG_EXTENSIONS), and GIF, which
# Pillow reads and that list lacks.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")


def pil_mode(channels: int) -> str:
    """Pillow's mode for images of ``channels`` channels: ``L`` for grey (and each view of a stereo
    pair, 2), ``RGB`` for 3."""
    return "RGB" if channels == 3 else "L"


def decode(source: str | os.PathLike | Image.Image, mode: str) -> torch.Tensor:
    """(C, H, W) uint8: an image file or a Pillow image as :func:`read_image` reads it."""
    return read_image(source, mode)[0]


def read_image(source: str | os.PathLike | Image.Image, mode: str) -> tuple[torch.Tensor, list[str]]:
    """(C, H, W) uint8 of an image file or a Pillow image in ``mode``, and a note for each thing done:
    its EXIF orientation applied (a phone's photo stored sideways is read upright), 16-bit, 32-bit and
    float grey scaled to 8 bits (Pillow's own conversion clips them), transparent pixels put on white
    (a drawing on a transparent page), palette and CMYK images through RGB, grey and colour converted
    (ITU-R 601-2 luma for grey). An animated image: its first frame. Raises Pillow's
    ``UnidentifiedImageError`` or ``OSError`` for a file it cannot read."""
    if isinstance(source, Image.Image):
        return _pixels(source, mode)
    with Image.open(source) as opened:
        return _pixels(opened, mode)


def _pixels(image: Image.Image, mode: str) -> tuple[torch.Tensor, list[str]]:
    import torch

    pixels, notes = page.decode(image, mode)  # NumPy and Pillow alone: prepare.py decodes as this does
    return torch.from_numpy(pixels), notes


def square(image: torch.Tensor, size: int) -> torch.Tensor:
    """(..., C, H, W) -> (..., C, size, size): the shorter side resized to ``size`` (antialiased
    bilinear), then the centre ``size`` x ``size`` crop."""
    from torchvision.transforms.v2 import functional as TF

    return TF.center_crop(TF.resize(image, size, antialias=True), size)


def downsampled(images: torch.Tensor, size: int) -> torch.Tensor:
    """(N, C, H, W) uint8 -> (N, C, size, size) uint8 by area averaging (96 -> 48: 2x2 blocks), rounded;
    in chunks, to bound the float copy."""
    import torch
    import torch.nn.functional as F

    small = torch.empty(*images.shape[:2], size, size, dtype=torch.uint8)
    for start in range(0, len(images), 2048):
        chunk = images[start : start + 2048].float()
        small[start : start + 2048] = F.interpolate(chunk, size=(size, size), mode="area").round_().to(torch.uint8)
    return small
