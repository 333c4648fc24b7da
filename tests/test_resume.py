"""Resuming: ckpt_path=<run folder> or last (the run's own overrides, then the new ones, its folder), and exactly."""

from __future__ import annotations

import functools
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml

from capsexp.callbacks.model_checkpoint import BestAndLastCheckpoint
from capsexp.data import MNISTDataModule
from capsexp.data.resumable import EpochSampler, ResumableDataLoader, step_generator
from capsexp.errors import CheckpointError
from capsexp.lit import Classifier, CrossEntropy
from capsexp.lit.schedulers import cosine_decay
from capsexp.models import LeNet5
from capsexp.overrides import hydra_value
from capsexp.run.resume import expand_run_folder, task_folder
from tests.helpers import PROJECT_ROOT, TINY_EM_CAPS, TINY_RUN, run_cli_in_process, saved_run, scalars


def test_a_run_folder_expands_to_its_overrides_then_the_new_ones_its_state_and_its_folder(tmp_path):
    run = saved_run(tmp_path / "run", "- model=em_caps_small\n- trainer.max_epochs=1\n- ckpt_path=old\n")
    expanded = expand_run_folder(["--cfg", "job", "trainer.max_epochs=3", f"ckpt_path={run}", "seed=2"])
    assert expanded == [
        "--cfg",
        "job",  # Hydra's flags stay in front
        "model=em_caps_small",  # the run's own, those given now left out: the new win
        "trainer.max_epochs=3",
        "seed=2",
        f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}",
        f"hydra.run.dir={run}",
    ]


def test_a_run_folder_cannot_continue_a_sweep(tmp_path):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- seed=1\n")
    with pytest.raises(CheckpointError, match="resumes one run: drop -m"):
        expand_run_folder(["-m", f"ckpt_path={tmp_path}"])


def test_a_quoted_checkpoint_path_is_read_as_hydra_reads_it(tmp_path):
    """The black-box attack step quotes its checkpoints' paths (a job folder's name holds "="): the
    quoted path of a file that exists is a checkpoint, not a missing path."""
    checkpoint = tmp_path / "+arm.net=capsnet" / "checkpoints" / "epoch_000-step_000003.ckpt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"")
    arguments = ["train=false", f"ckpt_path={hydra_value(checkpoint)}"]
    assert expand_run_folder(arguments) == arguments
    with pytest.raises(CheckpointError, match=r"ckpt_path=.*other\.ckpt: no such file or folder"):
        expand_run_folder(["train=false", f"ckpt_path={hydra_value(checkpoint.with_name('other.ckpt'))}"])


def test_a_file_is_left_to_the_checkpoint_checks_and_a_missing_path_is_refused_at_once(tmp_path):
    (tmp_path / "x.ckpt").write_bytes(b"")
    arguments = ["model=lenet5", f"ckpt_path={tmp_path / 'x.ckpt'}"]
    assert expand_run_folder(arguments) == arguments
    assert expand_run_folder(["model=lenet5"]) == ["model=lenet5"]
    assert expand_run_folder(["ckpt_path=null"]) == ["ckpt_path=null"]
    with pytest.raises(CheckpointError, match=r"ckpt_path=.*nothing\.ckpt: no such file or folder"):
        expand_run_folder([f"ckpt_path={tmp_path / 'nothing.ckpt'}"])


def _state(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def interrupt_resume_and_compare(common: list[str], folder: Path, signum: signal.Signals, max_step: int) -> int:
    """Train ``common`` whole, and again stopped by ``signum`` once training is under way, resumed
    from its folder; assert the two end with the same weights and validation accuracies. Returns
    the step the signal stopped the second run at."""
    whole = folder / "whole"
    result = run_cli_in_process(*common, f"hydra.run.dir={whole}")
    assert result.returncode == 0, result.stderr[-2000:]
    stopped = folder / "stopped"
    command = [sys.executable, "-m", "capsexp", *common, "callbacks.progress_log.interval_s=0.1"]
    command.append(f"hydra.run.dir={stopped}")
    process = subprocess.Popen(command, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in process.stdout:
        if "| step " in line:
            break
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 128 + signum, stderr[-2000:]
    stopped_at = torch.load(stopped / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert 0 < stopped_at < max_step
    resume = shlex.split(stderr.strip().splitlines()[-1].split("resume with: ")[1])
    assert resume == ["python", "-m", "capsexp", f"ckpt_path={stopped}"]  # the line the run printed
    resumed = run_cli_in_process(*resume[3:])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    overrides = yaml.safe_load((stopped / ".hydra" / "overrides.yaml").read_text())
    assert overrides == [*command[3:-1], f"ckpt_path={stopped / 'checkpoints' / 'last.ckpt'}"]  # in its folder
    assert "not resumable" not in resumed.stdout + resumed.stderr
    final, expected = _state(stopped / "checkpoints" / "last.ckpt"), _state(whole / "checkpoints" / "last.ckpt")
    assert final.keys() == expected.keys()
    assert all(torch.allclose(final[name], expected[name], atol=1e-5, rtol=0) for name in expected), stopped_at
    accuracies = [[s.value for s in scalars(run)["val/acc"]] for run in (whole, stopped)]
    assert accuracies[1][-3:] == accuracies[0][-3:]  # the resumed run logs what the whole one logged
    return stopped_at


@pytest.mark.parametrize(
    "lr_scheduler",
    [
        {"scheduler": functools.partial(torch.optim.lr_scheduler.ExponentialLR, gamma=0.9)},
        # A schedule over the run reads trainer.estimated_stepping_batches in configure_optimizers,
        # which sets up the training data before the checkpoint restores its position.
        {"scheduler": cosine_decay, "interval": "step"},
    ],
    ids=["exponential", "cosine"],
)
def test_a_run_stopped_twice_mid_epoch_and_resumed_ends_with_the_uninterrupted_runs_weights(
    lr_scheduler, mnist_dir, tmp_path
):
    """In one process, LeNet5 on shifted MNIST (random shifts, shuffled batches, 12 steps an epoch):
    stopped as a signal stops it during step 17, resumed from last.ckpt and stopped again during step
    21 of the same epoch, resumed again, against a run never stopped. The same through the command
    line with real signals: test_every_model_resumes_exactly (slow)."""

    losses: dict[str, dict[int, float]] = {}

    class RecordLosses(L.Callback):
        def __init__(self, folder: str) -> None:
            self.losses = losses.setdefault(folder, {})

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.losses[trainer.global_step] = float(outputs["loss"])

    def train(folder: str, stop_at: int | None = None, ckpt_path: Path | None = None) -> L.Trainer:
        L.seed_everything(3)
        datamodule = MNISTDataModule(
            mnist_dir, batch_size=20, val_size=60, verify_checksums=False, download=False, train_shift=2
        )
        module = Classifier(
            LeNet5(),
            CrossEntropy(),
            functools.partial(torch.optim.Adam, lr=3e-3),
            lr_scheduler,
        )
        checkpoints = BestAndLastCheckpoint(dirpath=tmp_path / folder, monitor="val/acc", mode="max", save_last=True)
        if stop_at is not None:
            module.on_train_batch_start = lambda batch, index: (
                checkpoints._on_signal(signal.SIGTERM, None) if module.global_step == stop_at else None
            )
        trainer = L.Trainer(
            max_epochs=3, val_check_interval=5, callbacks=[checkpoints, RecordLosses(folder)], logger=False,
            enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", default_root_dir=tmp_path,
        )  # fmt: skip
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
        return trainer

    whole = train("whole")
    train("stopped", stop_at=16)
    assert torch.load(tmp_path / "stopped" / "last.ckpt", weights_only=True)["global_step"] == 17
    train("stopped again", stop_at=20, ckpt_path=tmp_path / "stopped" / "last.ckpt")
    assert torch.load(tmp_path / "stopped again" / "last.ckpt", weights_only=True)["global_step"] == 21
    resumed = train("resumed", ckpt_path=tmp_path / "stopped again" / "last.ckpt")
    expected_weights, weights = whole.lightning_module.state_dict(), resumed.lightning_module.state_dict()
    for (name, expected), actual in zip(expected_weights.items(), weights.values(), strict=True):
        assert torch.allclose(actual, expected, atol=1e-5, rtol=0), name
    # What the weights alone might not show: the optimizer's moments and step counts, the decayed
    # learning rate, and the loss of every step after the resume.
    expected_optimizer, optimizer = whole.optimizers[0].state_dict(), resumed.optimizers[0].state_dict()
    assert optimizer["param_groups"] == expected_optimizer["param_groups"]  # lr included
    for index, expected in expected_optimizer["state"].items():
        assert float(optimizer["state"][index]["step"]) == float(expected["step"]) == 36
        for moment in ("exp_avg", "exp_avg_sq"):
            assert torch.allclose(optimizer["state"][index][moment], expected[moment], atol=1e-6, rtol=1e-4)
    assert sorted(losses["stopped again"]) == list(range(18, 22)) and sorted(losses["resumed"]) == list(range(22, 37))
    for folder in ("stopped again", "resumed"):
        expected_losses = {step: losses["whole"][step] for step in losses[folder]}
        assert losses[folder] == pytest.approx(expected_losses, abs=1e-5), folder


@pytest.mark.slow
@pytest.mark.parametrize(
    "model,devices,signum",
    [
        ("lenet5", 1, signal.SIGTERM),
        ("lenet5", 2, signal.SIGTERM),
        ("lenet5", 2, signal.SIGINT),
        ("capsnet", 1, signal.SIGINT),
        ("em_caps_small", 1, signal.SIGINT),
        ("em_caps_small", 1, signal.SIGTERM),
    ],
    ids=lambda value: value.name if isinstance(value, signal.Signals) else str(value),
)
def test_every_model_resumes_exactly(model, devices, signum, mnist_dir, tmp_path):
    common = [*TINY_RUN, f"paths.data_dir={mnist_dir}", f"model={model}", "data=shifted_mnist"]
    common += [f"trainer.devices={devices}", "trainer.max_epochs=4" if model != "lenet5" else "trainer.max_epochs=25"]
    if model.startswith("em_caps"):
        common += TINY_EM_CAPS
    interrupt_resume_and_compare(common, tmp_path, signum, max_step=48 if model != "lenet5" else 300)


def test_ckpt_path_last_resumes_the_newest_run_of_the_task_that_saved_a_state(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPSEXP_LOG_DIR", str(tmp_path))
    runs = tmp_path / "mytask" / "runs"
    started = ["2025-12-31_10-00-00", "2026-01-01_10-00-00", "2026-01-02_10-00-00", "2026-01-03_10-00-00"]
    for name, saved in zip(started, [True, True, True, False], strict=True):
        (runs / name / ".hydra").mkdir(parents=True)
        (runs / name / ".hydra" / "overrides.yaml").write_text(f"- task_name=mytask\n- seed={name[8:10]}\n")
        if saved:
            (runs / name / "checkpoints").mkdir()
            (runs / name / "checkpoints" / "last.ckpt").write_bytes(b"state")
    newest = runs / "2026-01-02_10-00-00"
    expanded = expand_run_folder(["task_name=mytask", "ckpt_path=last"])
    assert expanded[-2:] == [f"ckpt_path={newest / 'checkpoints' / 'last.ckpt'}", f"hydra.run.dir={newest}"]
    assert "seed=02" in expanded
    with pytest.raises(CheckpointError, match=r"ckpt_path=last: no run under .*othertask/runs holds"):
        expand_run_folder(["task_name=othertask", "ckpt_path=last"])
    with pytest.raises(CheckpointError, match=r"^ckpt_path=last: the log folder cannot be found \(.*no_such_model"):
        expand_run_folder(["model=no_such_model", "ckpt_path=last"])


def test_a_loader_resumes_at_the_image_it_stood_at_whatever_the_new_batch_size():
    data = torch.arange(20.0)
    original = ResumableDataLoader(data, EpochSampler(data), batch_size=4)
    original.sampler.set_epoch(3)
    batches = iter(original)
    seen = [next(batches), next(batches)]
    state = original.state_dict()
    assert state == {"epoch": 3, "images": 8}
    rest = torch.cat(list(batches))
    resumed = ResumableDataLoader(data, EpochSampler(data), batch_size=2)
    resumed.load_state_dict(state)
    assert torch.equal(torch.cat(list(resumed)), rest)  # the same images, in the same order
    assert sorted(torch.cat([*seen, rest]).tolist()) == data.tolist()  # each image once per epoch
    assert len(torch.cat(list(resumed))) == 20  # the next pass is a whole epoch again
    resumed.load_state_dict(state)
    next(iter(resumed))
    assert resumed.state_dict() == {"epoch": 3, "images": 10}  # the images before the resume count too


def test_the_training_order_is_shuffled_by_the_runs_seed_and_the_epoch(monkeypatch):
    data = list(range(64))

    def order(seed: int, epoch: int, rank: int = 0, replicas: int = 1) -> list[int]:
        monkeypatch.setenv("PL_GLOBAL_SEED", str(seed))
        sampler = EpochSampler(data, num_replicas=replicas, rank=rank)
        sampler.set_epoch(epoch)
        return list(sampler)

    assert sorted(order(1, 0)) == data and order(1, 0) != data  # a permutation, not the identity
    assert order(1, 0) == order(1, 0)  # a function of the seed and the epoch alone
    assert order(1, 1) != order(1, 0) and order(2, 0) != order(1, 0)
    shares = [order(1, 0, rank, 2) for rank in (0, 1)]
    assert sorted(shares[0] + shares[1]) == data  # DDP: disjoint shares that cover the epoch
    fresh = ResumableDataLoader(torch.utils.data.TensorDataset(torch.arange(64)), EpochSampler(data), batch_size=4)
    assert fresh.state_dict() == {"epoch": 0, "images": 0}  # before its first batch


def test_augmentation_draws_depend_on_the_runs_seed_the_step_and_the_process(monkeypatch):
    def draw(seed: int, step: int, rank: int = 0) -> torch.Tensor:
        monkeypatch.setenv("PL_GLOBAL_SEED", str(seed))
        return torch.rand(8, generator=step_generator(torch.device("cpu"), step, rank))

    assert torch.equal(draw(1, 5), draw(1, 5))  # a resumed run draws what the uninterrupted one drew
    default_rank = step_generator(torch.device("cpu"), 5).initial_seed()
    assert default_rank == step_generator(torch.device("cpu"), 5, 0).initial_seed()  # rank 0 by default
    others = [draw(2, 5), draw(1, 6), draw(1, 5, 1)]
    assert all(not torch.equal(draw(1, 5), other) for other in others)
    seeds = {step_generator(torch.device("cpu"), step).initial_seed() for step in range(1000)}
    assert len(seeds) == 1000 and max(seeds) < 2**63  # distinct, and within manual_seed's range


def test_the_task_folder_is_found_from_the_overrides_alone(tmp_path):
    """Flags, Hydra's own keys and the checkpoint are left out of the composition that finds
    ``<log_dir>/<task_name>``: each of them would make it fail."""
    arguments = ["--config-name=config", "-m", "+hydra.run.dir=x", f"paths.log_dir={tmp_path}", "task_name=mine"]
    assert task_folder([*arguments, "ckpt_path=last"], "ckpt_path=last") == tmp_path / "mine"


def test_a_test_only_run_takes_the_trained_runs_overrides_from_the_checkpoint_without_repeating_one(tmp_path):
    """train=false: the overrides the checkpoint records come first (no location, no task name); one the
    command gives again is left out, since Hydra refuses a group added twice (the black-box step gives
    +arm/net=... itself)."""
    import torch

    from capsexp.locations import RUN_RECORD

    checkpoint = tmp_path / "lone.ckpt"
    recorded = [
        "+arm/net=capsnet",
        "seed=1",
        "paths.data_dir=/no/such/folder",  # the training machine's: not on this one
        f"data.data_dir={tmp_path}",  # on this one: kept
        "task_name=t",
        "model.optimizer.lr=0.01",
    ]
    torch.save({RUN_RECORD: {"config": {}, "overrides": recorded}}, checkpoint)
    given = ["train=false", "+arm/net=capsnet", "seed=2", f"ckpt_path={checkpoint}"]
    assert expand_run_folder(given) == [
        f"data.data_dir={tmp_path}",
        "model.optimizer.lr=0.01",
        "train=false",
        "+arm/net=capsnet",
        "seed=2",
        f"ckpt_path={checkpoint}",
    ]


def test_a_resumed_run_that_does_not_validate_again_returns_its_earlier_best(mnist_dir, tmp_path):
    """The best validation accuracy is part of a run's state: resumed past its last validation, a run still
    returns it (what an Optuna trial resumed near its end is told), and the value is the one logged."""
    common = [*TINY_RUN, f"paths.data_dir={mnist_dir}", "trainer.val_check_interval=4", "trainer.limit_val_batches=1"]
    first = run_cli_in_process(*common, "trainer.max_steps=4", f"hydra.run.dir={tmp_path}")
    assert first.returncode == 0, first.stderr[-2000:]
    logged = scalars(tmp_path)["val/acc_best"][-1].value
    resumed = run_cli_in_process(f"ckpt_path={tmp_path}", "trainer.max_steps=6")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    output = resumed.stdout + resumed.stderr
    assert "never validated" not in output and f"val/acc_best = {logged:.4f}" in output


def _csv_rows(run: Path) -> list[dict[str, str]]:
    import csv

    with open(run / "csv" / "metrics.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def _logged_steps(rows: list[dict[str, str]], column: str) -> list[int]:
    return [int(row["step"]) for row in rows if row.get(column)]


def test_a_run_resumed_in_its_folder_logs_each_step_once_in_tensorboard_and_in_the_csv(mnist_dir, tmp_path):
    """LeNet5 with both loggers (logger=[tensorboard,csv]) for an epoch of 12 steps, its state at step 12
    kept aside; resumed in its folder to the end of a second epoch; then that state put back as the
    folder's last.ckpt (a run killed at step 24 whose last save was at step 12) and resumed again: the
    steps 12-23 are logged a second time. Each step's row is in metrics.csv once, the first epoch's rows
    as the first run wrote them, and its values are TensorBoard's."""
    run = tmp_path / "run"
    common = [*TINY_RUN, f"paths.data_dir={mnist_dir}", "logger=[tensorboard,csv]"]
    assert run_cli_in_process(*common, "trainer.max_epochs=1", f"hydra.run.dir={run}").returncode == 0
    first_epoch = _csv_rows(run)
    assert _logged_steps(first_epoch, "train/loss_step") == list(range(12))
    at_12 = tmp_path / "at_12.ckpt"
    at_12.write_bytes((run / "checkpoints" / "last.ckpt").read_bytes())
    for _ in range(2):
        resumed = run_cli_in_process(f"ckpt_path={run}", "trainer.max_epochs=2")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 24
        (run / "checkpoints" / "last.ckpt").write_bytes(at_12.read_bytes())
    rows = _csv_rows(run)
    assert _logged_steps(rows, "train/loss_step") == list(range(24))
    assert _logged_steps(rows, "val/acc") == [11, 23] and _logged_steps(rows, "test/acc") == [24]
    kept = [row for row in rows if int(row["step"]) < 12]
    assert kept == [row for row in first_epoch if int(row["step"]) < 12]  # as written, the columns included
    logged = scalars(run)
    for tag in ("train/loss_step", "val/acc", "test/acc"):
        from_csv = [(int(row["step"]), float(row[tag])) for row in rows if row.get(tag)]
        assert from_csv == [(s.step, pytest.approx(s.value, rel=1e-6)) for s in logged[tag]], tag


def test_the_csv_logger_keeps_the_rows_before_its_purge_step_and_adds_new_columns(tmp_path):
    """A metrics.csv as a run left it (a validation row among the training rows, steps not in order of
    rows), the logger started at purge step 3: rows of steps 0-2 kept, of 3-4 dropped; a new column
    rewrites the header over the kept rows. None keeps nothing, as Lightning's own logger does."""
    from capsexp.run.csv_logger import ResumableCSVLogger

    folder = tmp_path / "csv"
    folder.mkdir()
    (folder / "metrics.csv").write_text(
        "epoch,step,train/loss,val/acc\n0,0,2.5,\n0,1,2.25,\n0,2,2.0,\n0,2,,0.5\n0,4,1.5,\n0,3,1.75,\n"
    )
    logger = ResumableCSVLogger(tmp_path, name="csv", version="", purge_step=3)
    logger.log_metrics({"epoch": 0, "train/loss": 9.0}, step=3)
    logger.log_metrics({"epoch": 0, "lr": 0.125}, step=4)
    logger.save()
    assert (folder / "metrics.csv").read_text().splitlines() == [
        "epoch,lr,step,train/loss,val/acc",
        "0,,0,2.5,",
        "0,,1,2.25,",
        "0,,2,2.0,",
        "0,,2,,0.5",
        "0,,3,9.0,",
        "0,0.125,4,,",
    ]
    fresh = ResumableCSVLogger(tmp_path, name="csv", version="")
    fresh.log_metrics({"train/loss": 1.0}, step=0)
    fresh.save()
    assert (folder / "metrics.csv").read_text().splitlines() == ["step,train/loss", "0,1.0"]


def test_a_resumed_run_that_fails_before_its_first_step_keeps_its_earlier_logger_files(tmp_path):
    """The files the loggers wrote before the failing run (a resumed run's folder) stay; those it wrote go,
    and a logger folder it left empty with them."""
    import types

    from capsexp.run.run_folder import StepSeen, no_files_left_if_failed_early

    earlier = [tmp_path / "events.out.tfevents.1.host", tmp_path / "hparams.yaml", tmp_path / "csv" / "metrics.csv"]
    for path in earlier:
        path.parent.mkdir(exist_ok=True)
        path.write_text("logged before")
    loggers = [types.SimpleNamespace(log_dir=str(tmp_path), finalize=lambda status: None),
               types.SimpleNamespace(log_dir=str(tmp_path / "csv"), finalize=lambda status: None),
               types.SimpleNamespace(log_dir=str(tmp_path / "new_logger"), finalize=lambda status: None)]  # fmt: skip
    trainer = types.SimpleNamespace(loggers=loggers, callbacks=[object(), StepSeen()], is_global_zero=True)
    with pytest.raises(RuntimeError), no_files_left_if_failed_early(trainer):
        (tmp_path / "events.out.tfevents.2.host").write_text("this run")
        (tmp_path / "new_logger").mkdir()
        (tmp_path / "new_logger" / "metrics.csv").write_text("this run")
        raise RuntimeError("no data")
    assert all(path.read_text() == "logged before" for path in earlier)
    assert not (tmp_path / "events.out.tfevents.2.host").exists() and not (tmp_path / "new_logger").exists()
