"""MultiMNIST pairs: the invariants of the paper's recipe (section 6.1)."""

from __future__ import annotations

import pytest
import torch

from capsexp.data.multi_mnist import overlay_pairs, partners, translate
from tests.helpers import synthetic_digits


def digits(count: int = 200, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = synthetic_digits(count, seed)
    return torch.from_numpy(images).float() / 255, torch.from_numpy(labels).long()


def pairs(seed: int, **options):
    images, labels = digits()
    return overlay_pairs(images, labels, torch.Generator().manual_seed(seed), **options)


@pytest.mark.parametrize(("shift", "canvas"), [(4, 36), (6, 40), (0, 28)])
def test_pairs_hold_two_classes_shifted_within_bounds_summed_and_clipped(shift, canvas):
    images, labels = digits()
    made = overlay_pairs(images, labels, torch.Generator().manual_seed(0), shift=shift, canvas=canvas)
    assert made.images.shape == (200, 1, canvas, canvas) and made.components.shape == (200, 2, 1, canvas, canvas)
    assert torch.equal(made.labels[:, 0], labels) and (made.labels[:, 0] != made.labels[:, 1]).all()
    assert made.shifts.abs().max() <= shift
    if shift:
        assert made.shifts.abs().max() == shift and made.shifts.min() < 0  # the whole range is drawn
    assert torch.equal(made.images, made.components.sum(1).clamp(0, 1))
    assert (made.images.sum((1, 2, 3)) < made.components.sum((1, 2, 3, 4))).any()  # overlaps do clip
    # Nothing is pushed off the canvas: each component holds all of its digit's ink.
    first = made.components[:, 0].sum((1, 2, 3))
    assert torch.allclose(first, images.sum((1, 2)), rtol=1e-5)
    # The first component is the digit itself, centred, then shifted by its drawn shift.
    margin = (canvas - 28) // 2
    centred = torch.nn.functional.pad(images, (margin, margin, margin, margin))
    back = translate(made.components[:, 0, 0], -made.shifts[:, 0, 0], -made.shifts[:, 0, 1])
    assert torch.equal(back, centred)


def test_the_same_seed_gives_the_same_pairs_and_another_seed_others():
    a, b, c = pairs(1), pairs(1), pairs(2)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a.labels, c.labels) and not torch.equal(a.shifts, c.shifts)


def test_partners_cover_every_other_class():
    labels = torch.arange(1000) % 10
    chosen = labels[partners(labels, torch.Generator().manual_seed(0))]
    assert (chosen != labels).all()
    for digit in range(10):
        assert set(chosen[labels == digit].tolist()) == set(range(10)) - {digit}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"shift": 5, "canvas": 36}, "shift=5 pushes a 28x28 digit off a 36x36 canvas (at most 4"),
        ({"canvas": 20}, "canvas=20 is smaller than the 28x28 digits"),
        ({"shift": -1}, "overlay_pairs: shift=-1: must be greater than or equal to 0"),
    ],
)
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        pairs(0, **options)


def test_one_class_cannot_be_paired():
    images, _ = digits(10)
    with pytest.raises(ValueError, match="at least two classes"):
        overlay_pairs(images, torch.full((10,), 3), torch.Generator().manual_seed(0))
