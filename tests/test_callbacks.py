"""The callbacks' figures against values worked out by hand, driven by a stand-in trainer and clock."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from capsexp.callbacks import epoch_timer
from capsexp.callbacks.epoch_timer import EpochTimer
from capsexp.callbacks.progress_log import batch_size_of


class Clock:
    """time.perf_counter, set by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class MetricsLogger:
    def __init__(self) -> None:
        self.logged: list[tuple[dict, int]] = []

    def log_metrics(self, metrics: dict, step: int) -> None:
        self.logged.append((metrics, step))


def test_epoch_timer_counts_every_process_images_and_leaves_out_the_validations_inside_the_epoch(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(epoch_timer.time, "perf_counter", clock)
    loggers = [MetricsLogger(), MetricsLogger()]  # every logger gets the figures
    trainer = SimpleNamespace(training=True, sanity_checking=False, world_size=2, global_step=30, loggers=loggers)
    module = SimpleNamespace(device=torch.device("cpu"))
    timer = EpochTimer()

    def validation(start: float, end: float, **state) -> None:
        for name, value in state.items():
            setattr(trainer, name, value)
        clock.now = start
        timer.on_validation_start(trainer, module)
        clock.now = end
        timer.on_validation_end(trainer, module)
        trainer.training, trainer.sanity_checking = True, False

    validation(1.0, 4.0, training=True, sanity_checking=True)  # the sanity check, before the epoch: not counted
    clock.now = 10.0
    timer.on_train_epoch_start(trainer, module)
    for size in (4, 4, 2):  # per process; 2 processes
        timer.on_train_batch_end(trainer, module, None, (torch.zeros(size, 1, 2, 2), torch.zeros(size)), 0)
    validation(12.0, 15.0)  # inside the epoch: 3 s that are not training
    validation(15.5, 16.0, training=False)  # a validation outside training (trainer.validate): not subtracted
    clock.now = 20.0
    timer.on_train_epoch_end(trainer, module)
    for logger in loggers:
        ((metrics, step),) = logger.logged
        assert step == 30 and set(metrics) == {"perf/train_epoch_s", "perf/train_images_per_s"}
        assert metrics["perf/train_epoch_s"] == pytest.approx(7.0)  # 10 s less the 3 s validation
        assert metrics["perf/train_images_per_s"] == pytest.approx(20 / 7)
    # The next epoch starts from zero.
    clock.now = 30.0
    timer.on_train_epoch_start(trainer, module)
    timer.on_train_batch_end(trainer, module, None, [torch.zeros(5, 3)], 0)
    clock.now = 32.0
    timer.on_train_epoch_end(trainer, module)
    assert loggers[0].logged[-1][0] == {"perf/train_epoch_s": 2.0, "perf/train_images_per_s": 5.0}


def test_the_images_of_a_batch_are_the_first_dimension_of_its_first_tensor():
    assert batch_size_of((torch.zeros(7, 1, 28, 28), torch.zeros(7))) == 7
    assert batch_size_of([torch.zeros(3, 2)]) == 3
    assert batch_size_of(torch.zeros(5, 4)) == 5
    assert batch_size_of({"images": torch.zeros(2)}) == 0  # nothing it can count
