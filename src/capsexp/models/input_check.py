"""The input check every net makes: images of the shape it was built for, or a clear error."""

from __future__ import annotations

import torch

from capsexp.errors import InputShapeError


def _text(shape: tuple[int, ...]) -> str:
    return "x".join(str(size) for size in shape)


def check_images(images: torch.Tensor, image_shape: tuple[int, int, int], net: str) -> None:
    """Raise :class:`InputShapeError` unless ``images`` is (batch, *image_shape)."""
    if images.dim() != 4 or tuple(images.shape[1:]) != image_shape:
        got = _text(tuple(images.shape[1:])) if images.dim() == 4 else f"a tensor of shape {tuple(images.shape)}"
        raise InputShapeError(
            f"{net} was built for images of {_text(image_shape)} (channels x height x width) and got {got}. "
            "Build it with the data's in_channels and image_size (the model configs read "
            "geometry.channels and geometry.image_size), or give it images of that size."
        )
