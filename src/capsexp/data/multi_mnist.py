"""MultiMNIST pairs (Sabour, Frosst & Hinton 2017, section 6.1): a digit overlaid on a digit of another
class from the same split, each shifted by up to ``shift`` pixels in each direction on a square
canvas, the pixel values summed and clipped to [0, 1].

The paper: 28x28 digits on a 36x36 canvas (4 pixels of padding), shifts up to 4 pixels. The official
generator's variant pads 4 and shifts up to 6 (``shift=6``, a 40x40 canvas). Pairs are drawn on the
device the images live on, from a ``torch.Generator``: the same seed gives the same pairs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from capsexp.arguments import NonNegativeInt, PositiveInt, checked


class Pairs(NamedTuple):
    images: torch.Tensor  # (N, 1, S, S): the clipped sum of the two components
    components: torch.Tensor  # (N, 2, 1, S, S): each digit alone on the canvas (reconstruction targets)
    labels: torch.Tensor  # (N, 2): the base digit's class, then the overlaid one's
    shifts: torch.Tensor  # (N, 2, 2): (rows, columns) each component was shifted by


def translate(images: torch.Tensor, rows: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """Each image (N, H, W) moved down by ``rows[n]`` and right by ``columns[n]`` pixels, zeros shifted in."""
    count, height, width = images.shape
    source_rows = torch.arange(height, device=images.device) - rows[:, None]  # (N, H)
    source_columns = torch.arange(width, device=images.device) - columns[:, None]  # (N, W)
    inside = ((source_rows >= 0) & (source_rows < height))[:, :, None] & (
        (source_columns >= 0) & (source_columns < width)
    )[:, None, :]
    moved = images[
        torch.arange(count, device=images.device)[:, None, None],
        source_rows.clamp(0, height - 1)[:, :, None],
        source_columns.clamp(0, width - 1)[:, None, :],
    ]
    return moved * inside


def partners(labels: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """For each image, the index of an image of another class: the class drawn uniformly among the
    other classes present, the image uniformly within it."""
    classes, counts = torch.unique(labels, return_counts=True)
    if len(classes) < 2:
        raise ValueError(f"MultiMNIST pairs need digits of at least two classes, got only class {classes.tolist()}")
    device = labels.device
    by_class = torch.argsort(labels, stable=True)  # indices grouped by class, classes in ascending order
    starts = torch.cumsum(counts, 0) - counts
    own = torch.searchsorted(classes, labels)  # each image's class, as a position in `classes`
    offset = torch.randint(1, len(classes), (len(labels),), generator=generator, device=device)
    other = (own + offset) % len(classes)
    within = (torch.rand(len(labels), generator=generator, device=device) * counts[other]).long()
    return by_class[starts[other] + within.clamp(max=counts[other] - 1)]


@checked
def overlay_pairs(
    digits: torch.Tensor,
    labels: torch.Tensor,
    generator: torch.Generator,
    shift: NonNegativeInt = 4,
    canvas: PositiveInt = 36,
) -> Pairs:
    """One MultiMNIST example per digit in ``digits`` (N, H, W) or (N, 1, H, W), values in [0, 1]: the
    digit, and a partner of another class (:func:`partners`), each centred on a ``canvas`` x ``canvas``
    field and shifted independently by up to ``shift`` pixels in each direction."""
    digits = digits.reshape(len(digits), *digits.shape[-2:])
    height, width = digits.shape[-2:]
    if canvas < max(height, width):
        raise ValueError(f"canvas={canvas} is smaller than the {height}x{width} digits")
    margin = min(canvas - height, canvas - width) // 2
    if shift > margin:
        raise ValueError(
            f"shift={shift} pushes a {height}x{width} digit off a {canvas}x{canvas} canvas "
            f"(at most {margin}; a larger canvas allows more)"
        )
    top, left = (canvas - height) // 2, (canvas - width) // 2
    centred = digits.new_zeros(len(digits), canvas, canvas)
    centred[:, top : top + height, left : left + width] = digits
    other = partners(labels, generator)
    shifts = torch.randint(-shift, shift + 1, (len(digits), 2, 2), generator=generator, device=digits.device)
    first = translate(centred, shifts[:, 0, 0], shifts[:, 0, 1])
    second = translate(centred[other], shifts[:, 1, 0], shifts[:, 1, 1])
    components = torch.stack([first, second], dim=1).unsqueeze(2)
    return Pairs((first + second).clamp(0, 1).unsqueeze(1), components, torch.stack([labels, labels[other]], 1), shifts)
