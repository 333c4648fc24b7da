"""How an image becomes a trained net's input, as one object: ``capsexp.load(run).transforms``.

As torchvision's weights carry a ``transforms()`` object, each DataModule declares its
:class:`EvaluationTransform` (:attr:`~capsexp.data.base.InMemoryDataModule.evaluation_transform`): the image
conventions its evaluation images were made by (:mod:`capsexp.data.conventions`), then the last, on-device
step of its evaluation pipeline (pixels to [0, 1], a centre crop, a standardisation). The transform needs
no DataModule, no dataset and no Lightning: it is plain values, written into an export's ``model.json``
(``preprocessing``) and rebuilt from it by :meth:`EvaluationTransform.from_dict`. The DataModule's own
batches are standardised by :meth:`EvaluationTransform.normalized`, so the two cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from typing import NamedTuple

import torch
from PIL import Image, UnidentifiedImageError
from torchvision.transforms.v2 import functional as TF

from capsexp.data.augment import center_crop, standardize
from capsexp.data.conventions import ImageConventions, fit
from capsexp.data.images import pil_mode, read_image
from capsexp.data.page import NO_INK
from capsexp.errors import ImageError

ImageLike = str | os.PathLike | Image.Image | torch.Tensor


class ReadImage(NamedTuple):
    """One image as :meth:`EvaluationTransform.read` makes it: ``pixels``, (C, S, S) uint8 of the evaluation
    size, and ``notes``, what was done to it, in order."""

    pixels: torch.Tensor
    notes: list[str]

    @property
    def ink_found(self) -> bool:
        """False where the page was found blank (no ink) and given to the model as an empty image."""
        return not any(note.startswith(NO_INK) for note in self.notes)


@dataclasses.dataclass(frozen=True)
class EvaluationTransform:
    """An image, a file or a batch -> the net's input, as the DataModule's evaluation batches reach the net.

    channels: of the net's input (1 grey, 2 a stereo pair, 3 RGB). conventions: how the evaluation images
    look, of side ``conventions.size`` (what :meth:`read` fits an image to). crop: the centre crop taken
    from that side after scaling to [0, 1] (data stored larger than the net's input); None: none.
    mean, std: per-channel standardisation of pixels in [0, 1] (one value: every channel); None: none.
    per_image_standardization: each image standardised over its own pixels
    (:func:`~capsexp.data.augment.standardize`, as ``tf.image.per_image_standardization``)."""

    channels: int
    conventions: ImageConventions
    crop: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    per_image_standardization: bool = False

    @property
    def size(self) -> int:
        """The side of the images :meth:`read` gives (the evaluation size)."""
        return self.conventions.size

    @property
    def input_size(self) -> int:
        """The side of the net's input."""
        return self.crop or self.size

    # ---- an image -> uint8 pixels of the evaluation size ------------------------------------------
    def read(self, image: ImageLike, plain: bool = False, invert: str | bool | None = "auto") -> ReadImage:
        """One image (a file, a Pillow image, or a (C, H, W) or (H, W) tensor of pixels, uint8 or in [0, 1])
        as uint8 pixels of the evaluation size, made as the evaluation images were (``plain``: resized and
        centre-cropped alone; ``invert``: ``auto``, ``true`` or ``false``), with what was done to it."""
        notes: list[str] = []
        if isinstance(image, torch.Tensor):
            pixels = _uint8(image)
            channels = pixels.shape[0]
            if channels == 3 and self.channels != 3:
                pixels = TF.rgb_to_grayscale(pixels)
                notes.append("RGB converted to grey")
            elif channels == 1 and self.channels == 3:
                pixels = pixels.expand(3, -1, -1)
                notes.append("grey repeated as RGB")
            elif channels not in (1, 3, self.channels):
                pair = ", 2 (a stereo pair)" if self.channels == 2 else ""
                raise ImageError(f"a tensor image has {channels} channels: give 1 (grey){pair} or 3 (RGB), (C, H, W)")
        else:
            try:
                pixels, decoded = read_image(image, pil_mode(self.channels))
            except FileNotFoundError:
                raise ImageError(f"{image}: no such file") from None
            except (UnidentifiedImageError, OSError) as error:
                raise ImageError(f"{image}: not an image Pillow can read ({type(error).__name__})") from None
            notes += decoded
        if self.channels == 2 and pixels.shape[0] == 1:  # a stereo model: the image is both views
            pixels = pixels.expand(2, -1, -1)
            notes.append("used as both views of the stereo pair")
        fitted, fitting = fit(pixels.contiguous(), self.conventions, plain, invert)
        return ReadImage(fitted, notes + fitting)

    # ---- uint8 pixels of the evaluation size -> the net's input -----------------------------------
    def inputs(self, images: torch.Tensor) -> torch.Tensor:
        """(N, C, S, S) uint8 images of the evaluation size -> the net's input, on their device: to [0, 1],
        the centre crop, then :meth:`normalized`. Plain tensor operations, so an export traces them."""
        pixels = images.float().div_(255)
        if self.crop is not None and self.crop != pixels.shape[-1]:
            pixels = center_crop(pixels, self.crop)
        return self.normalized(pixels)

    def normalized(self, pixels: torch.Tensor) -> torch.Tensor:
        """Pixels in [0, 1] standardised as the net was trained (differentiable: attacks take gradients
        through it); the pixels themselves where the data is not standardised."""
        if self.per_image_standardization:
            return standardize(pixels)
        if self.mean is None or self.std is None:
            return pixels
        if len(self.mean) == 1:
            return (pixels - self.mean[0]) / self.std[0]
        mean, std = (
            torch.tensor(v, device=pixels.device, dtype=pixels.dtype).view(-1, 1, 1) for v in (self.mean, self.std)
        )
        return (pixels - mean) / std

    def __call__(
        self, images: ImageLike | Iterable[ImageLike], plain: bool = False, invert: str | bool | None = "auto"
    ) -> torch.Tensor:
        """Images (files, Pillow images, tensors (H, W) or (C, H, W), or a batch (N, C, H, W)) -> the net's
        input, (N, C, H, W): :meth:`read` each, then :meth:`inputs`."""
        if isinstance(images, (str, os.PathLike, Image.Image)) or (
            isinstance(images, torch.Tensor) and images.ndim in (2, 3)
        ):
            images = [images]
        read = [self.read(image, plain, invert).pixels for image in images]
        if not read:
            raise ImageError("no images to transform")
        return self.inputs(torch.stack(read))

    # ---- as plain values (model.json) -------------------------------------------------------------
    def as_dict(self) -> dict:
        """The transform as plain values: the conventions with every threshold (:meth:`ImageConventions.as_dict`),
        the channels, and the last step's crop and standardisation."""
        return {
            **self.conventions.as_dict(),
            "channels": self.channels,
            "crop": self.crop,
            "mean": None if self.mean is None else list(self.mean),
            "std": None if self.std is None else list(self.std),
            "per_image_standardization": self.per_image_standardization,
        }

    @classmethod
    def from_dict(cls, values: dict) -> EvaluationTransform:
        """The transform :meth:`as_dict` wrote (the page parameters it carries are capsexp's own constants,
        :data:`~capsexp.data.conventions.PAGE`, and are not read back)."""
        fields = {field.name for field in dataclasses.fields(ImageConventions)}
        conventions = ImageConventions(**{k: v for k, v in values.items() if k in fields})
        return cls(
            channels=int(values["channels"]),
            conventions=conventions,
            crop=values.get("crop"),
            mean=None if values.get("mean") is None else tuple(values["mean"]),
            std=None if values.get("std") is None else tuple(values["std"]),
            per_image_standardization=bool(values.get("per_image_standardization", False)),
        )


def _uint8(image: torch.Tensor) -> torch.Tensor:
    """Pixels as uint8: uint8 kept, floats in [0, 1] scaled and rounded; a (H, W) image gets a channel."""
    if image.ndim == 2:
        image = image[None]
    if image.ndim != 3:
        raise ImageError(f"a tensor image must be (C, H, W) or (H, W); got shape {tuple(image.shape)}")
    if image.dtype == torch.uint8:
        return image.cpu()
    if not image.is_floating_point() or image.min() < 0 or image.max() > 1:
        raise ImageError("a tensor image must be uint8, or float with pixels in [0, 1]")
    return image.detach().cpu().mul(255).round_().to(torch.uint8)
