"""Multiruns through the CLI: the joblib and submitit_local launchers, and an Optuna sweep."""

from __future__ import annotations

import pytest
import yaml

from tests.helpers import TINY_RUN, run_cli, run_cli_in_process, scalars


@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_launchers_run_each_job_in_its_own_folder(mnist_dir, tmp_path, launcher):
    result = run_cli(
        "-m",
        f"hydra/launcher={launcher}",
        "seed=1,2",
        *TINY_RUN,
        f"paths.data_dir={mnist_dir}",
        "trainer.max_epochs=1",
        env={"CAPSEXP_LOG_DIR": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert jobs == ["0", "1"]
    for job in jobs:
        assert (sweep / job / "checkpoints" / "last.ckpt").exists()
        assert any((sweep / job / "tensorboard").glob("events.out.tfevents.*"))
        assert yaml.safe_load((sweep / job / ".hydra" / "overrides.yaml").read_text())[0] == f"seed={int(job) + 1}"


def test_optuna_sweep_of_two_trials(mnist_dir, tmp_path):
    result = run_cli_in_process(
        "hparams_search=capsnet_optuna",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.sampler.n_startup_trials=2",
        *TINY_RUN,
        f"paths.data_dir={mnist_dir}",
        "trainer.max_epochs=1",
        "model.net.conv_channels=16",
        "model.net.primary_types=4",
        f"paths.log_dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    # data.batch_size is searched too, unless fixed on the command line, as TINY_RUN does.
    assert set(results["best_params"]) == {
        "model.optimizer.lr",
        "model.lr_scheduler.scheduler.decay_rate",
        "model.net.routing.iterations",
    }
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert [job.name for job in jobs] == ["0", "1"]
    # What Optuna was told is each trial's val/acc_best (optimized_metric): the best of them.
    best_per_trial = [scalars(job)["val/acc_best"][-1].value for job in jobs]
    assert results["best_value"] == pytest.approx(max(best_per_trial))
