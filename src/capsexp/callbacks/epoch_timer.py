"""Training time per epoch, without the validations run inside it, and peak accelerator memory.

Logged once per epoch (TensorBoard): ``perf/train_epoch_s`` (seconds of training in the epoch),
``perf/train_images_per_s`` and, on CUDA, ``perf/peak_memory_gib`` (``torch.cuda.max_memory_allocated``).
The accelerator is synchronised only at the edges of an epoch and of each validation, so the
timing costs nothing per step.
"""

from __future__ import annotations

import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn

from capsexp.callbacks.progress_log import batch_size_of
from capsexp.records.metric_names import TRAIN_EPOCH_S, TRAIN_IMAGES_PER_S


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class EpochTimer(Callback):
    def __init__(self) -> None:
        self.images = 0
        self.validation_s = 0.0
        self.start = 0.0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)
        _synchronize(pl_module.device)
        self.images, self.validation_s = 0, 0.0
        self.start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.images += batch_size_of(batch) * trainer.world_size

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A validation inside fit: its time is not training. (trainer.training is False while it runs:
        # Lightning's stage is then validating; the function, fitting.)
        if trainer.state.fn == TrainerFn.FITTING:
            _synchronize(pl_module.device)
            self.validation_start = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            _synchronize(pl_module.device)
            self.validation_s += time.perf_counter() - self.validation_start

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        _synchronize(pl_module.device)
        seconds = time.perf_counter() - self.start - self.validation_s
        metrics = {TRAIN_EPOCH_S: seconds, TRAIN_IMAGES_PER_S: self.images / max(seconds, 1e-9)}
        if pl_module.device.type == "cuda":
            metrics["perf/peak_memory_gib"] = torch.cuda.max_memory_allocated(pl_module.device) / 2**30
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
