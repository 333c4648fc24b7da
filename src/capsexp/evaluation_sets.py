"""The contract for a DataModule's test sets, and the names of their metrics.

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

PLAIN = ""  # the name of the one unmodified test set

_ROTATION_METRIC = re.compile(r"^test/acc_rot(-?[\d.]+)$")


def metric_suffix(name: str) -> str:
    """``"rot30"`` -> ``"_rot30"``; the plain test set has none."""
    return f"_{name}" if name else ""


def rotation_set_name(angle: float) -> str:
    """The test set of the test images rotated by ``angle`` degrees: ``rot30``, ``rot22.5``."""
    return f"rot{angle:g}"


def rotation_angle(metric: str) -> float | None:
    """``"test/acc_rot30"`` -> 30.0; ``None`` for a metric that is not a rotation set's accuracy."""
    match = _ROTATION_METRIC.match(metric)
    return float(match[1]) if match else None


def metrics_of_test_sets(test_set_names: Iterable[str] = (PLAIN,)) -> list[str]:
    """The test metrics the Classifier logs for these sets: ``test/acc`` first, then per set."""
    names = ["test/acc"]
    for name in test_set_names:
        names += [f"test/acc{metric_suffix(name)}", f"test/loss{metric_suffix(name)}"]
    return list(dict.fromkeys(names))
