"""BestAndLastCheckpoint: last.ckpt is always the latest state, the best stays separate, writes are atomic."""

from __future__ import annotations

import logging
import re
import shlex
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

from capsexp.callbacks.model_checkpoint import PARTIAL_SUFFIX, BestAndLastCheckpoint
from capsexp.data.resumable import EpochSampler, ResumableDataLoader
from tests.helpers import PROJECT_ROOT, TINY_RUN


class WorseningModel(BoringModel):
    """Logs a val/acc that is best at the first validation and falls after it."""

    def validation_step(self, batch, batch_idx):
        self.log("val/acc", 1.0 / (1 + self.global_step))
        return super().validation_step(batch, batch_idx)


def fit(tmp_path, max_steps: int, val_check_interval: int | float, **trainer_options) -> BestAndLastCheckpoint:
    callback = BestAndLastCheckpoint(
        dirpath=tmp_path / "checkpoints",
        filename="{step}",
        monitor="val/acc",
        mode="max",
        save_top_k=1,
        save_last=True,
        enable_version_counter=False,
    )
    trainer = L.Trainer(
        max_steps=max_steps,
        val_check_interval=val_check_interval,
        limit_val_batches=1,
        callbacks=[callback],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        **trainer_options,
    )
    trainer.fit(WorseningModel())
    return callback


def saved_step(path) -> int:
    return torch.load(path, map_location="cpu", weights_only=True)["global_step"]


def test_last_checkpoint_holds_the_final_step_when_the_metric_never_improves(tmp_path):
    # Validations at steps 4, 8, 12 (the first is the best); the run ends at 14, not a validation step.
    callback = fit(tmp_path, max_steps=14, val_check_interval=4)
    checkpoints = tmp_path / "checkpoints"
    assert saved_step(checkpoints / "last.ckpt") == 14
    assert callback.best_model_path.endswith("step=4.ckpt") and saved_step(callback.best_model_path) == 4
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt", "step=4.ckpt"]


def test_with_one_validation_an_epoch_the_best_and_the_last_are_both_kept(tmp_path):
    # ModelCheckpoint then saves at the end of each training epoch (steps 4, 8, 12), not at validation end.
    callback = fit(tmp_path, max_steps=-1, val_check_interval=1.0, max_epochs=3, limit_train_batches=4)
    assert saved_step(tmp_path / "checkpoints" / "last.ckpt") == 12
    assert callback.best_model_path.endswith("step=4.ckpt") and saved_step(callback.best_model_path) == 4


def test_last_checkpoint_follows_every_validation(tmp_path, monkeypatch):
    steps = []
    original = BestAndLastCheckpoint._save_last_checkpoint

    def record(self, trainer, candidates):
        original(self, trainer, candidates)
        steps.append(saved_step(self.last_model_path))

    monkeypatch.setattr(BestAndLastCheckpoint, "_save_last_checkpoint", record)
    fit(tmp_path, max_steps=12, val_check_interval=4)
    assert steps == [4, 8, 12]  # each written once, the final step's at its validation


@pytest.mark.slow
def test_a_process_killed_while_writing_leaves_the_previous_last_checkpoint_whole(tmp_path):
    # Validations at steps 3 and 6; the second write of last.ckpt is cut short by SIGKILL.
    script = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from lightning.pytorch.plugins.io import TorchCheckpointIO
        from tests.test_model_checkpoint import fit

        last_writes = []
        original = TorchCheckpointIO.save_checkpoint

        def save_then_die(self, checkpoint, path, storage_options=None):
            if str(path).endswith("last.ckpt{PARTIAL_SUFFIX}"):
                last_writes.append(path)
                if len(last_writes) == 2:
                    with open(path, "wb") as file:  # part of a file, then the kill
                        file.write(b"PK" + bytes(1000))
                    os.kill(os.getpid(), signal.SIGKILL)
            return original(self, checkpoint, path, storage_options)

        TorchCheckpointIO.save_checkpoint = save_then_die
        fit(Path({str(tmp_path)!r}), max_steps=6, val_check_interval=3)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    checkpoints = tmp_path / "checkpoints"
    assert saved_step(checkpoints / "last.ckpt") == 3  # the previous state, whole
    assert (checkpoints / ("last.ckpt" + PARTIAL_SUFFIX)).exists()  # the interrupted write, beside it


@pytest.mark.slow
def test_ctrl_c_stops_training_after_the_step_with_its_state_saved_and_the_resume_command(mnist_dir, tmp_path):
    # SIGTERM takes the same path; tests/test_resume.py stops runs with it.
    signum = signal.SIGINT
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "capsexp", *TINY_RUN, f"paths.data_dir={mnist_dir}", "model=lenet5"]
    command += ["trainer.max_epochs=10000", "callbacks.progress_log.interval_s=0.2", f"hydra.run.dir={run_dir}"]
    process = subprocess.Popen(
        command, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        for line in process.stdout:  # the first progress line: training has begun
            if "| step " in line:
                break
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 128 + signum, stderr[-3000:]
    message = stderr.strip().splitlines()[-1]
    match = re.fullmatch(
        rf"{signum.name}: training stopped at step (\d+), its state saved in (\S+); "
        r"resume with: (python -m capsexp .*)",
        message,
    )
    assert match, message
    step, path, resume = int(match[1]), match[2], shlex.split(match[3])
    assert Path(path) == run_dir / "checkpoints" / "last.ckpt" and saved_step(path) == step > 0
    assert resume == ["python", "-m", "capsexp", f"ckpt_path={run_dir}"]
    # The command pasted resumes the run in its folder: tests/test_resume.py (make test-all).


def test_resuming_a_checkpoint_without_the_data_position_warns_that_the_epoch_restarts(tmp_path, caplog):
    fit(tmp_path, max_steps=3, val_check_interval=3)  # BoringModel's plain DataLoader: no position saved
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert "combined_loader" not in torch.load(last, weights_only=True)["loops"]["fit_loop"]["state_dict"]
    callback = BestAndLastCheckpoint(dirpath=tmp_path / "resumed")
    trainer = L.Trainer(max_steps=5, logger=False, enable_progress_bar=False, callbacks=[callback])
    with caplog.at_level("WARNING", logger="capsexp.callbacks.model_checkpoint"):
        trainer.fit(WorseningModel(), ckpt_path=last)
    assert "holds no position of the training data" in caplog.text


class DropoutModel(BoringModel):
    """Trains through dropout on a fixed dataset: its weights depend on the global generator's draws."""

    def training_step(self, batch, batch_idx):
        return self(torch.nn.functional.dropout(batch, 0.5, training=True)).sum()

    def train_dataloader(self):
        data = torch.linspace(-1, 1, 20 * 32).view(20, 32)  # 5 batches an epoch: resumed mid-epoch at step 4
        return ResumableDataLoader(data, EpochSampler(data), batch_size=4)


def test_a_resumed_run_draws_from_the_global_generator_what_the_uninterrupted_one_drew(tmp_path):
    def train(folder: str, stop_at: int | None = None, ckpt_path=None) -> torch.nn.Module:
        L.seed_everything(0)
        model = DropoutModel()
        callback = BestAndLastCheckpoint(dirpath=tmp_path / folder)
        if stop_at is not None:  # as SIGTERM arriving during that step
            model.on_train_batch_start = lambda batch, index: (
                callback._on_signal(signal.SIGTERM, None) if model.global_step == stop_at else None
            )
        options = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
        L.Trainer(max_steps=8, callbacks=[callback], **options).fit(model, ckpt_path=ckpt_path)
        return model

    whole = train("whole")
    train("stopped", stop_at=3)
    assert torch.load(tmp_path / "stopped" / "last.ckpt", weights_only=True)["global_step"] == 4  # mid-epoch
    resumed = train("resumed", ckpt_path=tmp_path / "stopped" / "last.ckpt")
    assert all(torch.equal(a, b) for a, b in zip(whole.parameters(), resumed.parameters(), strict=True))


def test_a_signal_one_ddp_process_received_stops_every_process(tmp_path, monkeypatch):
    """Under DDP each process offers the signal it received (0: none) to an all-reduce with MAX, here
    played by a stand-in for the other process: a signal on either side stops both, and a process
    that received one itself keeps its own."""
    offered, other = [], {"signal": 0}

    def all_reduce(tensor: torch.Tensor, op) -> None:
        assert op == torch.distributed.ReduceOp.MAX and tensor.device == torch.device("cpu")
        offered.append(int(tensor.item()))
        tensor.copy_(torch.maximum(tensor, torch.tensor([other["signal"]])))

    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    trainer = SimpleNamespace(world_size=2, strategy=SimpleNamespace(root_device=torch.device("cpu")))
    callback = BestAndLastCheckpoint(dirpath=tmp_path)
    assert callback._signal_to_stop_on(trainer) is None and callback.stopped_by is None and offered == [0]
    other["signal"] = signal.SIGTERM
    assert callback._signal_to_stop_on(trainer) is signal.SIGTERM
    assert callback.stopped_by is signal.SIGTERM
    interrupted = BestAndLastCheckpoint(dirpath=tmp_path)
    interrupted.stopped_by = signal.SIGINT
    # The other's SIGTERM is the larger number: its own is kept.
    assert interrupted._signal_to_stop_on(trainer) is signal.SIGINT and offered[-1] == signal.SIGINT
    assert interrupted.stopped_by is signal.SIGINT


def test_a_signal_taken_in_during_the_ddp_agreement_waits_for_the_next_step(tmp_path, monkeypatch):
    """The handler of a signal that lands while the processes agree runs after the other process has
    already heard "train on": acted on at once, this process alone would save and stop, and DDP would
    hang. It stops at the next step's agreement, which both processes reach."""
    trainer = SimpleNamespace(world_size=2, strategy=SimpleNamespace(root_device=torch.device("cpu")))
    callback = BestAndLastCheckpoint(dirpath=tmp_path)
    offered = []

    def all_reduce(tensor: torch.Tensor, op) -> None:
        offered.append(int(tensor.item()))  # the other process offers 0: it heard nothing
        if len(offered) == 1:
            callback._on_signal(signal.SIGTERM, None)

    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    assert callback._signal_to_stop_on(trainer) is None  # what was agreed: neither had a signal
    assert callback.stopped_by is signal.SIGTERM  # remembered for the next step
    assert callback._signal_to_stop_on(trainer) is signal.SIGTERM and offered == [0, signal.SIGTERM]


def test_a_first_signal_asks_to_stop_after_the_step_and_a_second_ctrl_c_stops_at_once(tmp_path, caplog):
    callback = BestAndLastCheckpoint(dirpath=tmp_path)
    with caplog.at_level(logging.WARNING, logger="capsexp.callbacks.model_checkpoint"):
        callback._on_signal(signal.SIGINT, None)
    assert callback.stopped_by is signal.SIGINT
    assert caplog.messages == [
        "SIGINT received: training stops after this step, its state saved in last.ckpt "
        "(Ctrl-C again to stop at once, without saving)"
    ]
    with pytest.raises(KeyboardInterrupt):
        callback._on_signal(signal.SIGINT, None)
    # A scheduler's repeated SIGTERM is no Ctrl-C: the run still stops after its step, with its state saved.
    terminated = BestAndLastCheckpoint(dirpath=tmp_path)
    terminated._on_signal(signal.SIGTERM, None)
    terminated._on_signal(signal.SIGTERM, None)
    assert terminated.stopped_by is signal.SIGTERM
