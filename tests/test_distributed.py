"""DDP on 2 CPU processes (gloo) through the CLI, each job of a multirun on its own 2 processes."""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.conf import ConfigSourceInfo
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import OmegaConf, open_dict

from capsexp.locations import CONFIG_DIR
from capsexp.run.distributed import LAUNCH_ENVIRONMENT, child_process_command
from tests.helpers import TINY_RUN, run_cli, run_cli_in_process, scalars, write_mnist

TWO_PROCESSES = ["trainer.accelerator=cpu", "trainer.devices=2"]


@pytest.fixture
def uneven_mnist_dir(tmp_path: Path) -> Path:
    """301 train and 101 test images: the processes' shares differ by one image."""
    return write_mnist(tmp_path / "data", train=301, test=101)


def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LAUNCH_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)


def test_a_rank_is_started_as_this_job_alone_in_its_folder(tmp_path):
    """What the DDP launcher runs for rank k: this job's config and overrides as a single run, in the
    launching job's folder, with a log file of its own and no .hydra/ of its own, from the folder the
    user started in."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["model=lenet5", "seed=3"], return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(tmp_path / "run")
        cfg.hydra.runtime.cwd = str(tmp_path)
    with_config_dir = cfg.copy()  # as if started with --config-dir <tmp_path>/mine
    with open_dict(with_config_dir):
        source = ConfigSourceInfo(path=f"file://{tmp_path / 'mine'}", schema="file", provider="command-line")
        with_config_dir.hydra.runtime.config_sources.append(source)
    try:
        HydraConfig.instance().set_config(cfg)
        command, cwd = child_process_command(local_rank=1)
        assert command == [
            sys.executable, "-m", "capsexp", "--config-name", "config", "model=lenet5", "seed=3",
            f'hydra.run.dir="{tmp_path / "run"}"', "hydra.job.name=capsexp_rank1", "hydra.output_subdir=null",
        ]  # fmt: skip
        assert cwd == str(tmp_path)
        # A config folder given with --config-dir is passed on, and only that one.
        HydraConfig.instance().set_config(with_config_dir)
        command, _ = child_process_command(local_rank=0)
        assert command[3:7] == ["--config-dir", str(tmp_path / "mine"), "--config-name", "config"]
        assert command.count("--config-dir") == 1 and "hydra.job.name=capsexp_rank0" in command
    finally:
        HydraConfig.instance().cfg = None


@pytest.mark.slow  # 37 s: make test-all; test_a_rank_is_started_as_this_job_alone_in_its_folder covers the launch
@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`", "ignore:The dirpath has changed")
def test_a_multirun_of_two_process_jobs_runs_each_job_once_in_one_folder_with_exact_metrics(
    uneven_mnist_dir, tmp_path, monkeypatch
):
    clean_environment(monkeypatch)
    log_dir = tmp_path / "logs"
    # Two datasets: MultiMNIST's pairs, composed on each process from its own shard, train under DDP too.
    # val_size=61: the validation shares are uneven as well.
    job_overrides = [*TINY_RUN, "data.val_size=61", f"paths.data_dir={uneven_mnist_dir}"]
    result = run_cli(
        "-m",
        "model=lenet5",
        "data=mnist,multi_mnist",
        *job_overrides,
        *TWO_PROCESSES,
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=6",
        env={"CAPSEXP_LOG_DIR": str(log_dir)},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert list(log_dir.glob("train/*")) == [log_dir / "train" / "multiruns"], "a rank wrote a run folder"
    assert result.stdout.count("Launching 2 jobs") + result.stderr.count("Launching 2 jobs") == 1
    (sweep,) = (log_dir / "train" / "multiruns").iterdir()
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [job.name for job in jobs] == ["data=mnist", "data=multi_mnist"]  # what the sweep varies
    for job, data in zip(jobs, ("mnist", "multi_mnist"), strict=True):
        assert yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())[:2] == ["model=lenet5", f"data={data}"]
        checkpoints = sorted(p.name for p in (job / "checkpoints").iterdir())
        assert len(checkpoints) == 2 and "last.ckpt" in checkpoints, checkpoints
        # Each job trained once: one "Training" line per process log, one test/acc value.
        assert (job / "capsexp.log").read_text().count("] - Training") == 1
        assert (job / "capsexp_rank1.log").read_text().count("] - Training") == 1
        logged = scalars(job)
        # 6 steps of a global batch of 20 split over 2 processes per epoch.
        assert [s.step for s in logged["val/acc"]] == [5, 11] and len(logged["test/acc"]) == 1

    # The best checkpoint tested by one process must give exactly what the 2 processes reported:
    # every test image counted once (no padding), and the accuracy reduced over both processes.
    mnist_job = jobs[0]
    distributed = scalars(mnist_job)
    best = next(p for p in (mnist_job / "checkpoints").iterdir() if p.name != "last.ckpt")
    result = run_cli_in_process(
        *job_overrides, "data=mnist", "train=false", f"ckpt_path={best}", f"hydra.run.dir={tmp_path / 'single'}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    single = scalars(tmp_path / "single")
    assert distributed["test/acc"][-1].value == single["test/acc"][-1].value
    assert distributed["test/loss"][-1].value == pytest.approx(single["test/loss"][-1].value, rel=1e-5)
    # 101 images: an accuracy of k/101, which padding to 102 would not give.
    assert round(single["test/acc"][-1].value * 101, 3) == round(single["test/acc"][-1].value * 101)

    # Validation too (it picks the best checkpoint and is what sweepers optimise): the last state,
    # validated by one process, gives what the 2 processes logged at the final validation.
    last = mnist_job / "checkpoints" / "last.ckpt"
    assert validate_on_one_process(mnist_job, last) == distributed["val/acc"][-1].value


def validate_on_one_process(run_dir: Path, checkpoint: Path) -> float:
    """val/acc of ``checkpoint`` on the run's validation set, in this process, on one device."""
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    datamodule = instantiate(cfg.data, _convert_="all")
    module = instantiate(cfg.model, _convert_="partial")
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    (metrics,) = trainer.validate(module, datamodule=datamodule, ckpt_path=checkpoint, verbose=False)
    return metrics["val/acc"]
