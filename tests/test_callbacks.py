"""The callbacks' figures against values worked out by hand, driven by a stand-in trainer and clock."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.trainer.states import TrainerFn

from capsexp.callbacks import epoch_timer, progress_log
from capsexp.callbacks.epoch_timer import EpochTimer
from capsexp.callbacks.progress_log import ProgressLog, batch_size_of
from capsexp.figures.couplings import class_coupling_maps, coupling_figure
from capsexp.figures.images import displayable


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
    fitting = SimpleNamespace(fn=TrainerFn.FITTING)
    trainer = SimpleNamespace(
        training=True, state=fitting, sanity_checking=False, world_size=2, global_step=30, loggers=loggers
    )
    module = SimpleNamespace(device=torch.device("cpu"))
    timer = EpochTimer()

    def validation(start: float, end: float, **state) -> None:
        for name, value in state.items():
            setattr(trainer, name, value)
        clock.now = start
        timer.on_validation_start(trainer, module)
        clock.now = end
        timer.on_validation_end(trainer, module)
        trainer.training, trainer.sanity_checking, trainer.state = True, False, fitting

    # As Lightning has it: trainer.training False while any validation runs, the function fitting inside fit.
    validation(1.0, 4.0, training=False, sanity_checking=True)  # the sanity check, before the epoch: not counted
    clock.now = 10.0
    timer.on_train_epoch_start(trainer, module)
    for size in (4, 4, 2):  # per process; 2 processes
        timer.on_train_batch_end(trainer, module, None, (torch.zeros(size, 1, 2, 2), torch.zeros(size)), 0)
    validation(12.0, 15.0, training=False)  # inside the epoch: 3 s that are not training
    # A validation outside training (trainer.validate): not subtracted.
    validation(15.5, 16.0, training=False, state=SimpleNamespace(fn=TrainerFn.VALIDATING))
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


def test_epoch_timer_leaves_out_the_validations_of_a_real_fit():
    import time

    import lightning as L
    from lightning.pytorch.demos.boring_classes import BoringModel
    from lightning.pytorch.loggers import Logger

    class SlowValidation(BoringModel):
        def validation_step(self, batch, batch_idx):
            time.sleep(0.1)  # 2 validations of 3 batches inside the epoch: 0.6 s, and the sanity check's
            return super().validation_step(batch, batch_idx)

    class Kept(Logger):  # a Lightning logger that keeps what it is given
        name, version = "kept", 0

        def __init__(self):
            super().__init__()
            self.logged = []

        def log_metrics(self, metrics, step=None):
            self.logged.append((metrics, step))

        def log_hyperparams(self, params, *args, **kwargs):
            pass

    logger = Kept()
    trainer = L.Trainer(
        max_epochs=1, limit_train_batches=4, limit_val_batches=3, val_check_interval=2, logger=logger,
        callbacks=[EpochTimer()], enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    started = time.perf_counter()
    trainer.fit(SlowValidation())
    fit = time.perf_counter() - started
    ((metrics, _),) = [entry for entry in logger.logged if "perf/train_epoch_s" in entry[0]]
    assert metrics["perf/train_epoch_s"] < fit - 0.6


def test_the_images_of_a_batch_are_the_first_dimension_of_its_first_tensor():
    assert batch_size_of((torch.zeros(7, 1, 28, 28), torch.zeros(7))) == 7
    assert batch_size_of([torch.zeros(3, 2)]) == 3
    assert batch_size_of(torch.zeros(5, 4)) == 5
    assert batch_size_of({"images": torch.zeros(2)}) == 0  # nothing it can count


def progress_trainer(**state) -> SimpleNamespace:
    defaults = dict(
        global_step=100,
        world_size=1,
        is_global_zero=True,
        estimated_stepping_batches=1100,
        max_epochs=4,
        current_epoch=1,
        sanity_checking=False,
        callback_metrics={},
    )
    return SimpleNamespace(**{**defaults, **state})


def test_progress_lines_give_step_rate_elapsed_eta_mean_loss_and_validation(monkeypatch, caplog):
    clock = Clock()
    monkeypatch.setattr(progress_log.time, "perf_counter", clock)
    trainer, module = progress_trainer(), None  # resumed at step 100 of 1,100
    progress = ProgressLog(interval_s=30, when="always")
    caplog.set_level(logging.INFO, logger="capsexp.progress")
    clock.now = 1000.0
    progress.on_train_start(trainer, module)
    batch = (torch.zeros(300, 1, 1, 1), torch.zeros(300))
    for step, (now, loss) in enumerate([(1010.0, 2.0), (1029.0, 1.0), (1030.0, 0.5)], start=101):
        trainer.global_step, clock.now = step, now  # the line is due at 30 s, not before
        progress.on_train_batch_end(trainer, module, {"loss": torch.tensor(loss)}, batch, 0)
    trainer.callback_metrics = {"val/acc": torch.tensor(0.975)}
    progress.on_validation_end(trainer, module)
    trainer.sanity_checking, trainer.callback_metrics = True, {"val/acc": torch.tensor(0.1)}
    progress.on_validation_end(trainer, module)  # the sanity check's figure is not reported
    trainer.sanity_checking = False
    trainer.global_step, clock.now, trainer.world_size = 104, 1061.0, 2
    progress.on_train_batch_end(trainer, module, torch.tensor(4.0), batch, 0)
    clock.now = 4725.0
    progress.on_train_end(trainer, module)
    assert caplog.messages == [
        "training: 1,100 steps, a line every 30 s",
        # 3 x 300 images in 30 s; 3 of the 1,000 steps left at the start in 30 s: 997 more take 9,970 s;
        # the mean loss of the 3 steps since the start.
        "epoch 2/4 | step 103/1,100 (9.4%) | 30 img/s | elapsed 0:30 | ETA 2:46:10 | loss 1.1667",
        "validation at step 103: val/acc 0.9750",
        # 900 + 2 x 300 images (2 processes now) in 61 s; 4 steps in 61 s: 996 more take 15,189 s; one
        # step since the last line, so its loss alone.
        "epoch 2/4 | step 104/1,100 (9.5%) | 25 img/s | elapsed 1:01 | ETA 4:13:09 | loss 4.0000 | val/acc 0.9750",
        "training done: 4 steps in 1:02:05 (0 img/s)",
    ]


def test_progress_lines_without_a_step_limit_or_an_epoch_limit(monkeypatch, caplog):
    clock = Clock()
    monkeypatch.setattr(progress_log.time, "perf_counter", clock)
    trainer = progress_trainer(estimated_stepping_batches=float("inf"), max_epochs=-1, current_epoch=0, global_step=0)
    progress = ProgressLog(interval_s=5, when="always")
    caplog.set_level(logging.INFO, logger="capsexp.progress")
    progress.on_train_start(trainer, None)
    trainer.global_step, clock.now = 7, 5.0
    progress.on_train_batch_end(trainer, None, None, (torch.zeros(50, 1),), 0)
    assert caplog.messages == [
        "training: no step limit, a line every 5 s",
        "epoch 1 | step 7 | 10 img/s | elapsed 0:05",
    ]


def test_progress_lines_of_a_one_epoch_run_before_and_after_its_first_step(monkeypatch, caplog):
    clock = Clock()
    monkeypatch.setattr(progress_log.time, "perf_counter", clock)
    trainer = progress_trainer(estimated_stepping_batches=10, max_epochs=1, current_epoch=0, global_step=0)
    progress = ProgressLog(interval_s=0.25, when="always")
    caplog.set_level(logging.INFO, logger="capsexp.progress")
    progress.on_train_start(trainer, None)
    clock.now = 0.3  # a batch that made no step yet (trainer.accumulate_grad_batches=2): no ETA to give
    progress.on_train_batch_end(trainer, None, None, (torch.zeros(50, 1),), 0)
    trainer.global_step, clock.now = 1, 0.6
    progress.on_train_batch_end(trainer, None, None, (torch.zeros(100, 1),), 1)
    assert caplog.messages[1:] == [
        "epoch 1/1 | step 0/10 (0.0%) | 167 img/s | elapsed 0:00",
        # 150 images in 0.6 s; 9 steps left at 0.6 s each
        "epoch 1/1 | step 1/10 (10.0%) | 250 img/s | elapsed 0:01 | ETA 0:05",
    ]


def test_progress_lines_are_written_where_asked_and_by_the_first_process_only(monkeypatch):
    trainer = progress_trainer()
    for when, terminal, first, active in [
        ("auto", False, True, True),  # a file or a pipe: lines
        ("auto", True, True, False),  # a terminal has the progress bar
        ("always", True, True, True),
        ("never", False, True, False),
        ("always", False, False, False),  # other DDP processes stay quiet
    ]:
        monkeypatch.setattr(progress_log.sys.stdout, "isatty", lambda terminal=terminal: terminal)
        trainer.is_global_zero = first
        progress = ProgressLog(when=when)
        progress.on_train_start(trainer, None)
        assert progress.active is active, (when, terminal, first)


def test_a_stereo_pair_is_shown_side_by_side_left_then_right():
    pair = torch.stack([torch.full((2, 3), 0.25), torch.full((2, 3), 1.5)])[None]  # (1, 2, 2, 3)
    shown = displayable(pair)
    assert shown.shape == (1, 1, 2, 6) and shown.dtype == torch.float32
    assert (shown[..., :3] == 0.25).all() and (shown[..., 3:] == 1.0).all()  # clipped to the image range


def test_coupling_maps_are_each_class_mean_coupling_per_position_shown_on_one_scale_around_uniform():
    """Recomputed by hand: children type-major over a 2x2 grid of 2 types, 3 classes, images of
    classes 0, 0 and 2 (none of class 1, whose map is then undefined and its panel says so)."""
    torch.manual_seed(0)
    couplings = torch.softmax(torch.randn(3, 2 * 2 * 2, 3), dim=-1)
    labels = torch.tensor([0, 0, 2])
    maps = class_coupling_maps(couplings, labels, num_types=2)
    for j in (0, 2):
        images = [b for b in range(3) if labels[b] == j]
        for x in range(2):
            for y in range(2):
                values = [couplings[b, t * 4 + x * 2 + y, j] for b in images for t in range(2)]
                assert maps[j, x, y].item() == pytest.approx(sum(values).item() / len(values))
    assert torch.isnan(maps[1]).all()
    figure = coupling_figure(maps, ["cat", "dog", "bird"])
    panels = [ax for ax in figure.axes if ax.get_images()]
    assert [ax.get_title() for ax in panels] == ["cat", "dog (no image)", "bird"]
    low, high = panels[0].get_images()[0].get_clim()
    assert (low + high) / 2 == pytest.approx(1 / 3)  # centred at the uniform coupling
    assert high - 1 / 3 == pytest.approx((maps[[0, 2]] - 1 / 3).abs().max().item())
    assert any("uniform: 1/3" in ax.get_ylabel() for ax in figure.axes)  # the colour bar's label


def test_position_maps_read_children_type_major_or_with_the_types_innermost_as_em_numbers_them():
    """Children of 2 types on a grid of 2x2 positions, each child's coupling to class 0 its own
    number: type-major (type, h, w) and types innermost (h, w, type) give each position the mean of its
    own two children, worked out here by their numbers."""
    from capsexp.figures.couplings import position_maps

    children = 8
    first = torch.arange(children, dtype=torch.float64) / 10  # child i's share to class 0: i / 10
    couplings = torch.stack([first, 1 - first], dim=-1)[None]  # (1, 8, 2), each child's shares sum to 1
    type_major = position_maps(couplings, num_types=2)[0, 0]
    # child (t, h, w) is number 4t + 2h + w: position (h, w) averages 2h + w and 4 + 2h + w
    expected = torch.tensor([[(2 * h + w + 4 + 2 * h + w) / 20 for w in range(2)] for h in range(2)])
    assert torch.allclose(type_major, expected.double())
    innermost = position_maps(couplings, num_types=2, types_innermost=True)[0, 0]
    # child (h, w, t) is number 4h + 2w + t: position (h, w) averages 4h + 2w and 4h + 2w + 1
    expected = torch.tensor([[(2 * (4 * h + 2 * w) + 1) / 20 for w in range(2)] for h in range(2)])
    assert torch.allclose(innermost, expected.double())


def test_the_pose_perturbation_of_each_image_tweaks_its_own_predicted_capsule():
    """Sabour et al. 2017, Fig. 4, for a batch whose images predict different classes: row d, column s of
    image n is the decoder's image of n's predicted capsule with dimension d moved by the s-th step, the
    other capsules as they are; decoded here one by one."""
    from capsexp.figures.images import perturbed_reconstructions
    from capsexp.models import CapsNet

    torch.manual_seed(0)
    net = CapsNet(conv_channels=8, primary_types=2).eval()
    images = torch.rand(6, 1, 28, 28, generator=torch.Generator().manual_seed(3)) * torch.linspace(0.1, 1, 6).view(
        6, 1, 1, 1
    )
    images[::2, :, 5:15, 5:15] = 1  # a block on every other image: their classes differ untrained
    with torch.no_grad():
        output = net(images)
        predicted = output.scores.argmax(dim=-1)
        assert len(set(predicted.tolist())) > 1  # the batch predicts more than one class
        perturbed = perturbed_reconstructions(net, images, steps=3, max_delta=0.25)
        for n in (0, int((predicted != predicted[0]).nonzero()[0])):
            for d, s in ((0, 0), (5, 2)):
                pose = output.poses[n].clone()
                pose[predicted[n], d] += (-0.25, 0.0, 0.25)[s]
                expected = net.decode(pose[None], predicted[n : n + 1])[0]
                assert torch.allclose(perturbed[n, d, s], expected, atol=1e-6), (n, d, s)
