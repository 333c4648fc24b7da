"""Multiruns through the CLI: the joblib and submitit_local launchers, and an Optuna sweep."""

from __future__ import annotations

import pytest
import yaml

from tests.helpers import TINY_RUN, hparams_summary, run_cli, run_cli_in_process, scalars


# Both launchers name and place jobs alike (the naming runs in each job's process): the fast suite runs
# joblib's, make test-all both. One joblib worker runs both jobs: a process other than the sweep's,
# and one start-up of torch instead of two.
@pytest.mark.parametrize("launcher", ["joblib", pytest.param("submitit_local", marks=pytest.mark.slow)])
def test_launchers_run_each_job_in_its_own_folder(mnist_dir, tmp_path, launcher):
    result = run_cli(
        "-m",
        f"hydra/launcher={launcher}",
        *(["hydra.launcher.n_jobs=1"] if launcher == "joblib" else []),
        "seed=1,2",
        *TINY_RUN,
        f"paths.data_dir={mnist_dir}",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        env={"CAPSEXP_LOG_DIR": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir() and (p / ".hydra").is_dir())
    assert jobs == ["seed=1", "seed=2"]  # named by what the sweep varies, in every launcher's processes
    for job in jobs:
        assert (sweep / job / "checkpoints" / "last.ckpt").exists()
        assert any((sweep / job).glob("events.out.tfevents.*"))
        assert yaml.safe_load((sweep / job / ".hydra" / "overrides.yaml").read_text())[0] == job


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


def test_a_model_and_seed_sweep_names_its_runs_and_hparams_by_them(mnist_dir, tmp_path):
    """``-m model=lenet5,capsnet seed=1,2``: four runs, each a folder (and so a TensorBoard run) named by
    what differs, events in it; the HParams tab leads with those choices; the sweep's page compares the
    two models."""
    result = run_cli_in_process(
        "-m",
        "model=lenet5,capsnet",
        "seed=1,2",
        *TINY_RUN,
        f"paths.data_dir={mnist_dir}",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1",
        f"paths.log_dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    names = [f"model={model},seed={seed}" for model in ("lenet5", "capsnet") for seed in (1, 2)]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == sorted(names)
    for name in names:
        assert any((sweep / name).glob("events.out.tfevents.*")) and not (sweep / name / "tensorboard").exists()
        hparams = hparams_summary(sweep / name)["hparams"]
        model, seed = name.removeprefix("model=").split(",seed=")
        assert (hparams["model"], hparams["data"], hparams["seed"]) == (model, "mnist", int(seed))
    page = (sweep / "README.md").read_text()
    assert "| model=capsnet | 2 |" in page and "| model=lenet5 | 2 |" in page
    assert page.index("| model=lenet5 | 2 |") < page.index("| model=capsnet | 2 |")  # job order
    # Resuming by a run folder whose name holds "=" and "," (quoted for Hydra): the SLURM restart test
    # (tests/test_slurm.py) resumes a run in such a folder, named by its overrides.


def test_job_names_hold_what_the_sweep_varies_and_stay_unique_and_short(tmp_path):
    from omegaconf import OmegaConf

    from capsexp.config.run_names import MAX_NAME, job_name, run_name

    def record(*task: str, params: dict | None = None) -> str:
        sweep = tmp_path / str(len(list(tmp_path.iterdir())))
        sweep.mkdir()
        hydra = {"overrides": {"task": list(task)}, "sweeper": {"params": params}}
        OmegaConf.save(OmegaConf.create({"hydra": hydra}), sweep / "multirun.yaml")
        return str(sweep)

    job = ["model=capsnet", "data.data_dir=/data", "+arm/em_recipe=paper", "seed=2", "trainer.max_epochs=1"]
    sweep = record("model=lenet5,capsnet", "data.data_dir=/data", "trainer.max_epochs=1", params={"seed": "1,2"})
    assert job_name(job, sweep, 3) == "model=capsnet,seed=2"  # the shared epochs and the data folder left out
    sweep = record("+arm/em_recipe=paper,default", "seed=2,2")  # a value given twice: numbered
    assert job_name(job, sweep, 3) == "+arm.em_recipe=paper,seed=2_3"
    assert job_name(job, str(tmp_path / "no record"), 3) == "3"  # a sweeper that keeps no multirun.yaml
    assert run_name("T", []) == "T" and run_name("T", ["ckpt_path=/x", "model=capsnet"]) == "T_model=capsnet"
    many = [f"model.net.key{i}=value{i}" for i in range(21)]
    long = run_name("T", many[:20])
    assert len(long) == len("T_") + MAX_NAME and long != run_name("T", many)  # the digest tells them apart


def test_checkpoint_paths_in_named_job_folders_reach_hydra_quoted(tmp_path):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from capsexp.locations import hydra_value
    from capsexp.run.resume import expand_run_folder

    checkpoint = tmp_path / "model=capsnet,seed=1" / "checkpoints" / "epoch=0-step=2.ckpt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.touch()
    arguments = expand_run_folder(["train=false", f"ckpt_path={checkpoint}"])
    assert arguments == ["train=false", f"ckpt_path={hydra_value(checkpoint)}"]
    parser = OverridesParser.create()
    for text in [str(checkpoint), "/a b/it's", "C:\\x\\", "/plain/name.ckpt"]:
        assert parser.parse_override(f"ckpt_path={hydra_value(text)}").value() == text
