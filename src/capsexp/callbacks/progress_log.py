"""Progress as plain log lines, for output that is not a terminal (SLURM, nohup, CI, ``| tee``), and the
rich progress bar, for a terminal.

Into a file or a pipe, Rich's bar would write nothing until a stage ends, then each stage's last frame
(its escape codes too). There, :class:`ProgressLog` logs a line every ``interval_s`` seconds of training
instead: epoch, step, images/s, elapsed time, ETA, mean training loss since the last line, and the last
validation accuracy; and :class:`TerminalProgressBar` draws nothing.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, RichProgressBar
from pydantic import PositiveFloat

from capsexp.config.arguments import checked
from capsexp.records.metric_names import VAL_ACC

log = logging.getLogger("capsexp.progress")

When = Literal["auto", "always", "never"]


def on_a_terminal() -> bool:
    """Whether the run's output is a terminal: stdout, where the bar is drawn and the log lines go."""
    return sys.stdout.isatty()


@checked
class TerminalProgressBar(RichProgressBar):
    """Lightning's :class:`~lightning.pytorch.callbacks.RichProgressBar`, drawn on a terminal only.

    Args:
        when: ``auto`` (only when stdout is a terminal), ``always`` or ``never``.
        rich_options: RichProgressBar's own (``refresh_rate``, ``leave``, ...).
    """

    def __init__(self, when: When = "auto", **rich_options: Any) -> None:
        super().__init__(**rich_options)
        self.when = when

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if not (self.when == "always" or (self.when == "auto" and on_a_terminal())):
            self.disable()


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def batch_size_of(batch: Any) -> int:
    """Images in a batch: the first dimension of its first tensor (0 if there is none)."""
    first = batch[0] if isinstance(batch, (list, tuple)) else batch
    return int(first.shape[0]) if isinstance(first, torch.Tensor) else 0


@checked
class ProgressLog(Callback):
    """Log training progress every ``interval_s`` seconds.

    Args:
        interval_s: seconds between two lines.
        when: ``auto`` (only when stdout is not a terminal), ``always`` or ``never``.
    """

    def __init__(self, interval_s: PositiveFloat = 30.0, when: When = "auto") -> None:
        self.interval_s = interval_s
        self.when = when
        self.active = False
        self.last_val_acc: float | None = None

    def _enabled(self, trainer: L.Trainer) -> bool:
        wanted = self.when == "always" or (self.when == "auto" and not on_a_terminal())
        return wanted and trainer.is_global_zero

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.active = self._enabled(trainer)
        if not self.active:
            return
        self.start = self.last_time = time.perf_counter()
        self.start_step = self.last_step = trainer.global_step
        self.images = 0
        self.loss_sum: torch.Tensor | None = None
        self.loss_count = 0
        total = trainer.estimated_stepping_batches
        self.total_steps = int(total) if math.isfinite(total) else None
        planned = f"{self.total_steps:,} steps" if self.total_steps else "no step limit"
        log.info(f"training: {planned}, a line every {self.interval_s:g} s")

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.active:
            return
        self.images += batch_size_of(batch) * trainer.world_size
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            # Summed on the device; read once per line, so that a GPU is not synchronised every step.
            loss = loss.detach().float()
            self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss
            self.loss_count += 1
        now = time.perf_counter()
        if now - self.last_time >= self.interval_s:
            self._log_line(trainer, now)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.active or trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get(VAL_ACC)
        if value is not None:
            self.last_val_acc = float(value)
            log.info(f"validation at step {trainer.global_step:,}: {VAL_ACC} {self.last_val_acc:.4f}")

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.active:
            return
        elapsed = time.perf_counter() - self.start
        steps = trainer.global_step - self.start_step
        log.info(
            f"training done: {steps:,} steps in {_duration(elapsed)} ({self.images / max(elapsed, 1e-9):,.0f} img/s)"
        )

    def _log_line(self, trainer: L.Trainer, now: float) -> None:
        step, elapsed = trainer.global_step, now - self.start
        rate = self.images / max(elapsed, 1e-9)
        epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else None
        parts = [f"epoch {trainer.current_epoch + 1}" + (f"/{epochs}" if epochs else "")]
        if self.total_steps:
            parts.append(f"step {step:,}/{self.total_steps:,} ({100 * step / self.total_steps:.1f}%)")
        else:
            parts.append(f"step {step:,}")
        parts += [f"{rate:,.0f} img/s", f"elapsed {_duration(elapsed)}"]
        done = step - self.start_step
        if self.total_steps and done > 0:
            parts.append(f"ETA {_duration(elapsed / done * (self.total_steps - step))}")
        if self.loss_count:
            parts.append(f"loss {float(self.loss_sum) / self.loss_count:.4f}")
            self.loss_sum, self.loss_count = None, 0
        if self.last_val_acc is not None:
            parts.append(f"{VAL_ACC} {self.last_val_acc:.4f}")
        log.info(" | ".join(parts))
        self.last_time, self.last_step = now, step
