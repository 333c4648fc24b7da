"""Image files as uint8 tensors: one decoder for ``data=image_folder`` and for predicting on a user's
images, so that an image reaches a net exactly as the images it was trained on did.

Decoding is Pillow's, as torchvision's ``ImageFolder`` reads files (PNG, JPEG, BMP, GIF, WEBP, TIFF, ...),
with what a person's files need beside it (:func:`read_image`); grey (``L``) or RGB by
:meth:`PIL.Image.Image.convert`, whose RGB-to-grey is ITU-R 601-2 luma.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np
from PIL import ExifTags, Image, ImageOps

if TYPE_CHECKING:  # torch and torchvision are imported where used: listing files needs neither
    import torch

# The file endings taken as images: those of torchvision's ImageFolder (its IMG_EXTENSIONS), and GIF, which
# Pillow reads and that list lacks.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")
_WIDE_GREY = ("I", "I;16", "I;16B", "I;16L", "I;16N", "F")  # 16-bit, 32-bit and float grey


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
    notes, found = [], image.mode
    orientation = image.getexif().get(ExifTags.Base.Orientation, 1)
    if orientation != 1:  # (exif_transpose copies even an upright image)
        image = ImageOps.exif_transpose(image)
        notes.append(f"turned upright by its EXIF orientation ({orientation})")
    if image.mode in _WIDE_GREY:
        values = np.asarray(image, dtype=np.float64)
        top = 65535.0 if image.mode.startswith("I;16") else max(float(values.max()), 1.0)
        image = Image.fromarray(np.clip(values * (255.0 / top), 0, 255).round().astype(np.uint8), "L")
        notes.append(f"{found} pixels scaled to 8 bits")
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        ground = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(ground, image.convert("RGBA")).convert("RGB")
        notes.append("transparent pixels put on white")
    if image.mode not in ("L", "RGB", "1"):  # palette, CMYK, YCbCr, ...: their colours first
        image = image.convert("RGB")
    grey = found in ("1", "L", "LA", *_WIDE_GREY)  # a palette image (P) counts as colour
    if mode == "L" and not grey:
        notes.append("RGB converted to grey (ITU-R 601-2 luma), as the model's training images")
    elif mode == "RGB" and grey:
        notes.append("grey converted to RGB, as the model's training images")
    return _tensor(image, mode), notes


def _tensor(image: Image.Image, mode: str) -> torch.Tensor:
    """The pixels of ``image`` in ``mode`` (converted only where its own mode differs) as (C, H, W) uint8,
    through a NumPy array: for small images, a third of torchvision's pil_to_tensor's time."""
    import torch

    pixels = torch.from_numpy(np.array(image if image.mode == mode else image.convert(mode), dtype=np.uint8))
    return pixels.unsqueeze(0) if pixels.ndim == 2 else pixels.permute(2, 0, 1).contiguous()


def square(image: torch.Tensor, size: int) -> torch.Tensor:
    """(..., C, H, W) -> (..., C, size, size): the shorter side resized to ``size`` (antialiased
    bilinear), then the centre ``size`` x ``size`` crop."""
    from torchvision.transforms.v2 import functional as TF

    return TF.center_crop(TF.resize(image, size, antialias=True), size)
