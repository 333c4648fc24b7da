"""How a dataset's evaluation images were made, declared as data, and a person's image made the same way.

A net trained on MNIST has seen white ink on a black ground, each digit framed as LeCun et al. (1998)
framed them: "size normalized to fit in a 20x20 pixel box while preserving their aspect ratio", then
"centered in a 28x28 image by computing the center of mass of the pixels". A photo of a digit drawn on
paper is none of these: dark ink on a light ground, anywhere on a larger page. Each DataModule declares
its :class:`ImageConventions` (as torchvision's weights carry their ``transforms()`` and timm's
``pretrained_cfg`` its input conventions), and :func:`fit` applies them to a (C, H, W) uint8 image,
saying what it did:

- polarity (``light_ink``): an image whose border (its ground) is lighter than the image on average, i.e.
  dark ink on a light ground, is inverted;
- framing (``digit_box``): the ink's bounding box is scaled to ``digit_box`` pixels on its longer side
  (antialiased bilinear, aspect kept), placed by its centre of mass at the centre of a ``digit`` x
  ``digit`` field, and that field at the centre of a larger canvas (``size``) where the data has one;
- otherwise an image of another size has its shorter side resized to ``size`` (antialiased bilinear)
  and is centre-cropped to a square.

An image already of the evaluation size is taken as the dataset's own (only its polarity is checked),
and a digit-sized one on a canvas dataset as a framed digit. ``plain=True`` applies no convention: the
resize and crop alone.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torchvision.transforms.v2 import functional as TF

from capsexp.data.augment import centred
from capsexp.data.images import square

# An image's ground is read in its border: the outer tenth of each side.
_BORDER_SHARE = 0.1
# Of the range from the ground (the border's median) to the brightest ink, what counts as ink for the
# bounding box, and the floor below which a pixel becomes ground (paper texture, JPEG noise).
_INK_LEVEL, _GROUND_LEVEL = 0.25, 0.15
_FAINTEST_INK = 32  # grey levels above the ground: less than this anywhere, and the page is blank
RESIZE_FILTER = "bilinear, antialiased (torchvision.transforms.v2.functional.resize, antialias=True)"


@dataclasses.dataclass(frozen=True)
class ImageConventions:
    """How the evaluation images of a dataset look (see the module's docstring).

    size: the evaluation image's side. light_ink: the images show light ink on a dark ground (MNIST and
    its variants, Fashion-MNIST). digit_box, digit: digits framed as MNIST's (20 in 28); None: not
    framed. The resize filter is :data:`RESIZE_FILTER`."""

    size: int
    light_ink: bool = False
    digit_box: int | None = None
    digit: int = 28

    def as_dict(self) -> dict:
        """The conventions as plain values (``model.json``), with the resize filter, so that another
        runtime can make the same input."""
        return {**dataclasses.asdict(self), "resize_filter": RESIZE_FILTER}


def fit(image: torch.Tensor, conventions: ImageConventions, plain: bool = False) -> tuple[torch.Tensor, list[str]]:
    """A (C, H, W) uint8 image of any size as a (C, size, size) uint8 image made as the dataset's were,
    and a note for each thing done to it (see the module's docstring)."""
    size, notes = conventions.size, []
    shape = tuple(image.shape[-2:])
    if plain:
        if shape == (size, size):
            return image, notes
        return square(image, size), [f"resized (shorter side to {size}, centre crop): fit=plain"]
    if conventions.light_ink and _ground_is_lighter(image):
        image = 255 - image
        notes.append("inverted: dark ink on a light ground, where the model's training images are light on dark")
    if shape == (size, size):
        return image, notes
    if conventions.digit_box is None:
        return square(image, size), [*notes, f"resized (shorter side to {size}, centre crop)"]
    digit = conventions.digit
    if shape != (digit, digit):
        image, note = frame_digit(image, conventions.digit_box, digit)
        notes.append(note)
    if size != digit:
        image = centred(image, size)
        notes.append(f"placed at the centre of the {size}x{size} canvas")
    return image, notes


def _ground_is_lighter(image: torch.Tensor) -> bool:
    """Whether the image's ground, the median of its border (its outer tenth), is lighter than the image's
    mean: then the ink, the part that is not ground, is darker than the ground. A median, so that a digit
    touching the border does not count as ground; the whole image's mean, so that ink anywhere counts."""
    grey = _grey(image)
    return _ground(grey) > float(grey.mean())


def _grey(image: torch.Tensor) -> np.ndarray:
    """(C, H, W) uint8 -> (H, W), the channels' mean (a grey image's own pixels, not copied). NumPy: on a
    digit-sized image, a tenth of the time of torch's small-tensor ops, paid for every image a command reads."""
    pixels = image.numpy()
    return pixels[0] if len(pixels) == 1 else pixels.mean(axis=0, dtype=np.float32)


def _ground(grey: np.ndarray) -> float:
    """The median of an (H, W) image's outer tenth on each side (at least one pixel): its ground."""
    band = max(1, round(_BORDER_SHARE * min(grey.shape)))
    border = np.concatenate(
        [grey[:band].ravel(), grey[-band:].ravel(), grey[:, :band].ravel(), grey[:, -band:].ravel()]
    )
    middle = len(border) // 2  # the upper median: np.partition takes a fraction of np.median's time here
    return float(np.partition(border, middle)[middle])


def frame_digit(image: torch.Tensor, box: int, field: int) -> tuple[torch.Tensor, str]:
    """A (C, H, W) uint8 image of light ink on a dark ground as MNIST framed its digits: the ground
    (the border's median) made 0 and the brightest ink 255, the ink's bounding box scaled to ``box``
    pixels on its longer side (aspect kept), placed by its centre of mass at the centre of a ``field``
    x ``field`` image; and a note. A page without ink comes back blank, and says so."""
    grey = _grey(image).astype(np.float32)
    ink = torch.from_numpy(grey - _ground(grey)).clamp_(min=0)
    peak = float(ink.max())
    blank = image.new_zeros(image.shape[0], field, field)
    if peak < _FAINTEST_INK:
        return blank, f"no ink found (a blank page): given to the model as an empty {field}x{field} image"
    ink = ((ink / peak - _GROUND_LEVEL) / (1 - _GROUND_LEVEL)).clamp_(0, 1)
    rows, columns = (ink > _INK_LEVEL).any(dim=1).nonzero()[:, 0], (ink > _INK_LEVEL).any(dim=0).nonzero()[:, 0]
    top, bottom, left, right = int(rows[0]), int(rows[-1]) + 1, int(columns[0]), int(columns[-1]) + 1
    crop = ink[top:bottom, left:right]
    scale = box / max(crop.shape)
    scaled_size = [max(1, round(side * scale)) for side in crop.shape]
    scaled = TF.resize(crop[None], scaled_size, antialias=True)[0].clamp_(0, 1)
    weight = scaled.sum()
    # The centre of mass in pixel indices, placed at index field / 2 (MNIST's mean is (14.0, 14.0) in 28).
    centre_y = float((scaled.sum(dim=1) * torch.arange(scaled.shape[0])).sum() / weight)
    centre_x = float((scaled.sum(dim=0) * torch.arange(scaled.shape[1])).sum() / weight)
    y, x = round(field / 2 - centre_y), round(field / 2 - centre_x)
    framed = torch.zeros(field, field)
    # Clipped where the centre of mass lies so far off the box's centre that the box leaves the field.
    y0, x0 = max(y, 0), max(x, 0)
    y1, x1 = min(y + scaled.shape[0], field), min(x + scaled.shape[1], field)
    framed[y0:y1, x0:x1] = scaled[y0 - y : y1 - y, x0 - x : x1 - x]
    framed = framed.mul_(255).round_().to(torch.uint8).expand(image.shape[0], -1, -1).contiguous()
    return framed, (
        f"framed as MNIST's digits: the ink's {bottom - top}x{right - left} box scaled to {box} pixels "
        f"on its longer side, centred by its mass in {field}x{field}"
    )
