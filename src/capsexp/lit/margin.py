"""Margin schedules for the spread loss (``model.margin``): the margin as a function of training progress.

:class:`capsexp.lit.Classifier` sets ``objective.margin`` from its schedule before every training step
and logs it as ``train/margin``. The progress (global step, or epoch plus the fraction of it done) is
what Lightning restores from a checkpoint: a resumed run continues with exactly the margin it would
have had.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import PositiveFloat

from capsexp.arguments import UnitInterval, checked


class MarginSchedule:
    """Base class: subclasses define ``margin(step, epoch)``; ``epoch`` is fractional."""

    def margin(self, step: int, epoch: float) -> float:
        raise NotImplementedError


@checked
class LinearMargin(MarginSchedule):
    """The paper: the margin grows linearly from ``start`` to ``end`` over ``duration`` epochs or steps."""

    def __init__(
        self,
        start: UnitInterval = 0.2,
        end: UnitInterval = 0.9,
        duration: PositiveFloat = 10,
        unit: Literal["epoch", "step"] = "epoch",
    ) -> None:
        self.start, self.end, self.duration, self.unit = start, end, duration, unit

    def margin(self, step: int, epoch: float) -> float:
        progress = min(1.0, (step if self.unit == "step" else epoch) / self.duration)
        return self.start + (self.end - self.start) * progress


@checked
class SigmoidMargin(MarginSchedule):
    """The authors' OpenReview recipe: m = 0.2 + 0.79 * sigmoid(min(10, step / 50000 - 4))."""

    def __init__(
        self, start: UnitInterval = 0.2, span: UnitInterval = 0.79, step_scale: PositiveFloat = 50000, shift: float = 4
    ) -> None:
        self.start, self.span, self.step_scale, self.shift = start, span, step_scale, shift

    def margin(self, step: int, epoch: float) -> float:
        return self.start + self.span / (1.0 + math.exp(-min(10.0, step / self.step_scale - self.shift)))
