"""Margin schedules for the spread loss: callbacks that set ``objective.margin`` before every step.

The margin is a function of the trainer's progress (global step, or epoch plus the fraction of it
done), which Lightning restores from a checkpoint: a resumed run continues with exactly the margin it
would have had. Logged as ``train/margin``.
"""

from __future__ import annotations

import math

import lightning as L


class MarginSchedule(L.Callback):
    """Base class: subclasses define ``margin(step, epoch)``; ``epoch`` is fractional."""

    def margin(self, step: int, epoch: float) -> float:
        raise NotImplementedError

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        objective = getattr(pl_module, "objective", None)
        if not hasattr(objective, "margin"):
            return  # not a margin-based objective (e.g. LeNet5's cross-entropy)
        batches = trainer.num_training_batches
        epoch = trainer.current_epoch + (batch_idx / batches if batches and math.isfinite(batches) else 0.0)
        objective.margin = self.margin(trainer.global_step, epoch)
        pl_module.log("train/margin", float(objective.margin), on_step=True, on_epoch=False)


class LinearMargin(MarginSchedule):
    """The paper: the margin grows linearly from ``start`` to ``end`` over ``duration`` epochs or steps."""

    def __init__(self, start: float = 0.2, end: float = 0.9, duration: float = 10, unit: str = "epoch") -> None:
        if unit not in ("epoch", "step"):
            raise ValueError(f"unit must be 'epoch' or 'step', got {unit!r}")
        if duration <= 0:
            raise ValueError(f"duration must be > 0, got {duration}")
        self.start, self.end, self.duration, self.unit = start, end, duration, unit

    def margin(self, step: int, epoch: float) -> float:
        progress = min(1.0, (step if self.unit == "step" else epoch) / self.duration)
        return self.start + (self.end - self.start) * progress


class SigmoidMargin(MarginSchedule):
    """The authors' OpenReview recipe: m = 0.2 + 0.79 * sigmoid(min(10, step / 50000 - 4))."""

    def __init__(self, start: float = 0.2, span: float = 0.79, step_scale: float = 50000, shift: float = 4) -> None:
        self.start, self.span, self.step_scale, self.shift = start, span, step_scale, shift

    def margin(self, step: int, epoch: float) -> float:
        return self.start + self.span / (1.0 + math.exp(-min(10.0, step / self.step_scale - self.shift)))
