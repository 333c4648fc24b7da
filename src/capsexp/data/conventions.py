"""How a dataset's evaluation images were made, declared as data, and a person's image made the same way.

A net trained on MNIST has seen white ink on a black ground, each digit framed as LeCun et al. (1998)
framed them: "size normalized to fit in a 20x20 pixel box while preserving their aspect ratio", then
"centered in a 28x28 image by computing the center of mass of the pixels". A photo of a digit drawn on
paper is none of these: dark ink on a light ground, anywhere on a larger page. Each DataModule declares
its :class:`ImageConventions` (as torchvision's weights carry their ``transforms()`` and timm's
``pretrained_cfg`` its input conventions), and :func:`fit` applies them to a (C, H, W) uint8 image,
saying what it did:

- polarity (``light_ink``): the paper's lighting is estimated as a large-scale background and taken out,
  and a page whose ink is darker than its ground is inverted (``invert=true|false`` decides instead);
- framing (``digit_box``): the ink, read against the paper's lighting divided out, has its bounding box
  scaled to ``digit_box`` pixels on its longer side (antialiased bilinear, aspect kept), placed by its
  centre of mass at the centre of a ``digit`` x ``digit`` field, and that field at the centre of a larger
  canvas (``size``) where the data has one;
- a dataset that downsampled its published images (``official_size``, smallNORB's 96x96) has an image of
  that size downsampled as its own were (area averaging);
- otherwise an image of another size has its shorter side resized to ``size`` (antialiased bilinear)
  and is centre-cropped to a square.

How, step by step, with NumPy and Pillow alone: :mod:`capsexp.data.page`, which an export writes beside
the model as ``prepare.py``; its parameters are :data:`PAGE`, written into ``model.json``.

An image already of the evaluation size is taken as the dataset's own (only its polarity is checked),
and a digit-sized one on a canvas dataset as a framed digit. ``plain=True`` applies no convention: the
resize and crop alone.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from capsexp.data import page
from capsexp.data.images import downsampled, square


@dataclasses.dataclass(frozen=True)
class PageParameters:
    """How a page's lighting is taken out and its ink framed (:mod:`capsexp.data.page` says how each is used).

    background_grid: cells on the longer side of the grid the lighting is estimated on (box averages).
    background_filter: the closing's window, as a share of the grid's longer side: wider than a stroke of a
    digit filling the page, narrower than the lighting's changes. background_margin: cells the closing's
    erosion reaches beyond its dilation on each side, so that a shadow's edge does not read as ink.
    polarity_grid, polarity_filter: the grid and the median's window (a share of its longer side) the page's
    polarity (and a blob's ink) is read against. faintest_ink: a page whose ink nowhere takes this share of
    the paper's brightness (dark ink; of full white for light ink) is blank. ground_level: of the brightest
    ink, what is made ground (paper texture, JPEG noise, ruled lines). ink_level: of the way from that
    ground to the brightest ink, what counts for the ink's bounding box."""

    background_grid: int = 64
    background_filter: float = 0.2
    background_margin: int = 2
    polarity_grid: int = 16
    polarity_filter: float = 0.5
    faintest_ink: float = 0.3
    ground_level: float = 0.4
    ink_level: float = 0.25


PAGE = PageParameters()  # the one home of these values: model.json and prepare.py read them from here
RESIZE_FILTER = "bilinear, antialiased (Pillow's Image.resize on float pixels, for the framing)"


@dataclasses.dataclass(frozen=True)
class ImageConventions:
    """How the evaluation images of a dataset look (see the module's docstring).

    size: the evaluation image's side. light_ink: the images show light ink on a dark ground (MNIST and
    its variants, Fashion-MNIST). digit_box, digit: digits framed as MNIST's (20 in 28); None: not
    framed. official_size: the side of the dataset's published images, which it downsampled to ``size``
    by area averaging (smallNORB's 96); an image of that side is downsampled so. The resize filter
    is :data:`RESIZE_FILTER`."""

    size: int
    light_ink: bool = False
    digit_box: int | None = None
    digit: int = 28
    official_size: int | None = None

    def as_dict(self) -> dict:
        """The conventions and :data:`PAGE` as plain values (``model.json``), with the resize filter, so that
        another runtime (``prepare.py``) makes the same input."""
        return {**dataclasses.asdict(self), **dataclasses.asdict(PAGE), "resize_filter": RESIZE_FILTER}


def fit(
    image: torch.Tensor, conventions: ImageConventions, plain: bool = False, invert: str | bool | None = "auto"
) -> tuple[torch.Tensor, list[str]]:
    """A (C, H, W) uint8 image of any size as a (C, size, size) uint8 image made as the dataset's were,
    and a note for each thing done to it (see the module's docstring). ``invert``: ``auto`` (the page's
    polarity decides), ``true`` or ``false``; ValueError for another value."""
    size = conventions.size
    notes: list[str] = []
    official = conventions.official_size
    if official not in (None, size) and tuple(image.shape[-2:]) == (official, official):
        # capsexp downsamples with the code that made the dataset's cache (page.fit_page does so for prepare.py)
        image, notes = downsampled(image[None], size)[0], [page.downsampled_note(official, size)]
    if plain:
        if tuple(image.shape[-2:]) == (size, size):
            return image, notes
        return square(image, size), [*notes, f"resized (shorter side to {size}, centre crop): fit=plain"]
    pixels = image.numpy()
    fitted, fitting = page.fit_page(pixels, conventions.as_dict(), _square, invert)
    if fitted is pixels:  # nothing done: the image itself
        return image, notes + fitting
    return torch.from_numpy(fitted if fitted.flags.writeable else fitted.copy()), notes + fitting


def _square(pixels: np.ndarray, size: int) -> np.ndarray:
    return square(torch.from_numpy(pixels), size).numpy()
