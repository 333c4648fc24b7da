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

from capsexp.config.arguments import UnitInterval, checked
from capsexp.errors import ConfigError


class MarginSchedule:
    """Base class: subclasses define ``margin(step, epoch, total_steps)``; ``epoch`` is fractional,
    ``total_steps`` the run's length in training steps (``math.inf`` when it has none)."""

    def margin(self, step: int, epoch: float, total_steps: float = math.inf) -> float:
        raise NotImplementedError


@checked
class LinearMargin(MarginSchedule):
    """The paper: the margin grows linearly from ``start`` to ``end`` over ``duration`` epochs or steps,
    or (``unit="run"``) over that fraction of the run's training steps, which keeps the ramp inside a
    run whose learning rate decays to 0 at its end (``model/lr_scheduler=cosine``)."""

    def __init__(
        self,
        start: UnitInterval = 0.2,
        end: UnitInterval = 0.9,
        duration: PositiveFloat = 10,
        unit: Literal["epoch", "step", "run"] = "epoch",
    ) -> None:
        if unit == "run" and duration > 1:
            raise ValueError(f"LinearMargin: duration={duration}: must be at most 1 with unit=run (a fraction)")
        self.start, self.end, self.duration, self.unit = start, end, duration, unit

    def margin(self, step: int, epoch: float, total_steps: float = math.inf) -> float:
        elapsed = epoch if self.unit == "epoch" else step
        if self.unit == "run":
            if not (math.isfinite(total_steps) and total_steps > 0):
                raise ConfigError(
                    "model.margin.unit=run: a margin ramp over a fraction of the run needs the run's length; "
                    "set trainer.max_steps or trainer.max_epochs"
                )
            elapsed = step / total_steps
        return self.start + (self.end - self.start) * min(1.0, elapsed / self.duration)


@checked
class SigmoidMargin(MarginSchedule):
    """The authors' OpenReview recipe: m = 0.2 + 0.79 * sigmoid(min(10, step / 50000 - 4))."""

    def __init__(
        self, start: UnitInterval = 0.2, span: UnitInterval = 0.79, step_scale: PositiveFloat = 50000, shift: float = 4
    ) -> None:
        self.start, self.span, self.step_scale, self.shift = start, span, step_scale, shift

    def margin(self, step: int, epoch: float, total_steps: float = math.inf) -> float:
        return self.start + self.span / (1.0 + math.exp(-min(10.0, step / self.step_scale - self.shift)))
