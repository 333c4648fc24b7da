"""The names of the metrics a run logs, declared once, and the contract for a DataModule's test sets.

A capsexp DataModule declares its test sets in ``test_set_names``: one name per test DataLoader, in
order; ``""`` names the plain test set. :class:`capsexp.lit.Classifier` builds one accuracy and one
loss mean per set in ``setup`` from that list, and logs them as ``test/acc<suffix>`` and
``test/loss<suffix>`` (:func:`metric_suffix`); ``test/acc`` is always the first set's accuracy.
``capsexp.run.train`` names them for TensorBoard's HParams tab, ``capsexp.compare`` reads rotation sets
back with :func:`rotation_angle`. Nothing here imports torch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# What the Classifier logs and everything else reads back (checkpointing, early stopping, progress lines,
# the HParams tab, comparisons, studies). The YAML that names them (the callbacks' monitor,
# optimized_metric) spells them as here; tests/test_configs.py holds it to that.
VAL_ACC = "val/acc"
VAL_ACC_BEST = "val/acc_best"  # the best val/acc so far
VAL_LOSS = "val/loss"
TEST_ACC = "test/acc"  # the first test set's accuracy
# A net learned when its best validation accuracy is above this many times chance (1 / classes); at or
# below it, what it predicts says little more than the class frequencies, and a comparison with it shows
# that it did not train, not what its arm changes (capsexp.results.differences, capsexp.run.stages).
LEARNED_OVER_CHANCE = 2.0


def learned(accuracy: float, classes: int) -> bool:
    """Whether an accuracy in [0, 1] over ``classes`` classes is above :data:`LEARNED_OVER_CHANCE` times chance."""
    return accuracy > LEARNED_OVER_CHANCE / classes


_PRESENCE = "val/presence_"  # + gap, target, largest_other: medians of the class scores (Classifier)
PRESENCE_GAP = f"{_PRESENCE}gap"

PLAIN = ""  # the name of the one unmodified test set

RECONSTRUCTIONS = "val/reconstructions"  # the image of digits and their reconstructions (callbacks.image_logging)

TRAIN_EPOCH_S = "perf/train_epoch_s"  # seconds of an epoch's training steps, its validations left out
TRAIN_IMAGES_PER_S = "perf/train_images_per_s"  # training throughput of an epoch (capsexp.callbacks.EpochTimer)

# What a run records of its model before training, beside its hyperparameters (capsexp.run.train).
MODEL_PARAMETERS = "model/params"
MODEL_FLOPS = "model/flops_per_image"  # forward, per image

_ROTATION_METRIC = re.compile(rf"^{TEST_ACC}_rot(-?[\d.]+)$")


def is_accuracy(metric: str) -> bool:
    """A share of images classified right, in [0, 1]: ``val/acc``, ``val/acc_best``, ``test/acc`` and each
    test set's (``test/acc_rot30``), ``train/acc``."""
    return metric.rsplit("/", 1)[-1].startswith("acc")


def metric_suffix(name: str) -> str:
    """``"rot30"`` -> ``"_rot30"``; the plain test set has none."""
    return f"_{name}" if name else ""


def test_accuracy(name: str) -> str:
    """The accuracy logged for the test set ``name``: ``"affnist"`` -> ``"test/acc_affnist"``; the plain
    set's is ``test/acc``."""
    return f"{TEST_ACC}{metric_suffix(name)}"


def presence_metric(name: str) -> str:
    """``"gap"`` -> ``"val/presence_gap"``: a median of the class scores over the validation images
    (``target``, ``largest_other``, ``gap``) that the Classifier logs for presence-score objectives."""
    return f"{_PRESENCE}{name}"


def rotation_set_name(angle: float) -> str:
    """The test set of the test images rotated by ``angle`` degrees: ``rot30``, ``rot22.5``."""
    return f"rot{angle:g}"


def rotation_angle(metric: str) -> float | None:
    """``"test/acc_rot30"`` -> 30.0; ``None`` for a metric that is not a rotation set's accuracy."""
    match = _ROTATION_METRIC.match(metric)
    return float(match[1]) if match else None


def metrics_of_test_sets(test_set_names: Iterable[str] = (PLAIN,)) -> list[str]:
    """The test metrics the Classifier logs for these sets: ``test/acc`` first, then per set."""
    names = [TEST_ACC]
    for name in test_set_names:
        names += [test_accuracy(name), f"test/loss{metric_suffix(name)}"]
    return list(dict.fromkeys(names))
