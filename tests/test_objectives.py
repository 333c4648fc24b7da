"""The training objectives against their papers' formulas, computed by hand in plain Python."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from capsexp.lit import CapsuleLoss, CrossEntropy

LENGTHS = [[0.95, 0.30, 0.05], [0.50, 0.85, 0.12]]  # capsule lengths: 2 images x 3 classes


def margin_by_hand(lengths, present, m_pos, m_neg, lambda_):
    """Sabour et al. (2017), Eq. 4, summed over the classes, averaged over the images."""
    per_image = []
    for row, classes in zip(lengths, present, strict=True):
        total = 0.0
        for k, length in enumerate(row):
            if k in classes:
                total += max(0.0, m_pos - length) ** 2
            else:
                total += lambda_ * max(0.0, length - m_neg) ** 2
        per_image.append(total)
    return sum(per_image) / len(per_image)


@pytest.mark.parametrize(("targets", "present"), [([0, 2], [{0}, {2}]), ([[0, 1], [1, 2]], [{0, 1}, {1, 2}])])
def test_capsule_loss_is_eq_4_plus_the_weighted_sum_of_squared_pixel_errors(targets, present):
    images = torch.tensor([[[[0.0, 1.0], [0.5, 0.25]]], [[[1.0, 0.0], [0.0, 0.0]]]])
    reconstructions = torch.tensor([[[[0.5, 1.0], [0.0, 0.25]]], [[[0.0, 0.0], [0.0, 0.5]]]])
    if len(present[0]) == 2:  # one reconstruction per object: each against the image (test stand-in)
        reconstructions = reconstructions[:, None].expand(2, 2, 1, 2, 2)
        images = images[:, None].expand(2, 2, 1, 2, 2)
    output = SimpleNamespace(scores=torch.tensor(LENGTHS), reconstructions=reconstructions)
    # Values unlike the defaults and unlike each other: an argument passed in the wrong place shows.
    loss = CapsuleLoss(m_pos=0.8, m_neg=0.2, lambda_=0.3, recon_weight=0.01)
    terms = loss(output, images, torch.tensor(targets))
    margin = margin_by_hand(LENGTHS, present, 0.8, 0.2, 0.3)
    squared = (reconstructions - images).pow(2).flatten(1).sum(1).tolist()
    recon = sum(squared) / len(squared)
    assert terms["margin_loss"].item() == pytest.approx(margin, rel=1e-6)
    assert terms["recon_loss"].item() == pytest.approx(recon, rel=1e-6)
    assert terms["loss"].item() == pytest.approx(margin + 0.01 * recon, rel=1e-6)
    # The paper's values by default.
    defaults = CapsuleLoss()(output, images, torch.tensor(targets))
    assert defaults["margin_loss"].item() == pytest.approx(margin_by_hand(LENGTHS, present, 0.9, 0.1, 0.5), rel=1e-6)


def test_several_objects_train_each_class_as_an_independent_sigmoid_with_smoothed_targets():
    """MultiMNIST's baseline objective: binary cross-entropy per class, targets 1 for the classes
    present and 0 otherwise, smoothed towards 1/2 by label_smoothing."""
    scores = torch.tensor([[2.0, -1.0, 0.5], [0.0, 3.0, -2.0]])
    targets = torch.tensor([[0, 1], [1, 1]])  # the second image: two of the same class
    present = [[1, 1, 0], [0, 1, 0]]
    for smoothing in (0.0, 0.2):
        total = 0.0
        for row, wanted in zip(scores.tolist(), present, strict=True):
            for score, y in zip(row, wanted, strict=True):
                y = y * (1 - smoothing) + smoothing / 2
                p = 1 / (1 + math.exp(-score))
                total -= y * math.log(p) + (1 - y) * math.log(1 - p)
        loss = CrossEntropy(label_smoothing=smoothing)(scores, None, targets)["loss"]
        assert loss.item() == pytest.approx(total / 6, rel=1e-6)
    half = CrossEntropy()(scores.half(), None, targets)["loss"]  # computed in the scores' dtype
    assert half.dtype == torch.float16


def test_one_object_trains_a_softmax_cross_entropy_with_smoothed_targets():
    scores = torch.tensor([[2.0, -1.0, 0.5], [0.0, 3.0, -2.0]])
    targets = torch.tensor([2, 1])
    smoothing = 0.3
    total = 0.0
    for row, target in zip(scores.tolist(), targets.tolist(), strict=True):
        log_softmax = [s - math.log(sum(math.exp(v) for v in row)) for s in row]
        wanted = [(1 - smoothing) * (k == target) + smoothing / 3 for k in range(3)]
        total -= sum(w * p for w, p in zip(wanted, log_softmax, strict=True))
    loss = CrossEntropy(label_smoothing=smoothing)(scores, None, targets)["loss"]
    assert loss.item() == pytest.approx(total / 2, rel=1e-6)
