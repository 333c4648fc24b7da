"""Multiruns through the CLI: the joblib and submitit_local launchers, a sweep finished after a kill, and an
Optuna sweep."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml

from capsexp.locations import LAST_CHECKPOINT as LAST
from capsexp.overrides import hydra_value
from capsexp.run.sweep_resume import FINISHED
from tests.helpers import PROJECT_ROOT, TINY_RUN, hparams_summary, run_cli, run_cli_in_process, scalars


# Both launchers name and place jobs alike (the naming runs in each job's process). One joblib worker runs
# both jobs: a process other than the sweep's, and one start-up of torch instead of two.
@pytest.mark.slow
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


# The shipped CapsNet search run end to end (a search of LeNet5's learning rate is killed and resumed below;
# the fast suite composes every search config).
@pytest.mark.slow
def test_optuna_sweep_of_two_trials(mnist_dir, tmp_path):
    result = run_cli_in_process(
        "hparams_search=capsnet_optuna",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.sampler.n_startup_trials=2",
        *TINY_RUN,
        f"paths.data_dir={mnist_dir}",
        "trainer.max_steps=4",
        "trainer.val_check_interval=4",
        "model.net.conv_channels=16",
        "model.net.primary_types=4",
        "~hydra.callbacks.comparison",
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


@pytest.mark.slow
def test_a_model_and_seed_sweep_names_its_runs_and_hparams_by_them(mnist_dir, tmp_path):
    """``-m model=lenet5,capsnet_small seed=1,2``: four runs, each a folder (and so a TensorBoard run) named by
    what differs, events in it; the HParams tab leads with those choices; the sweep's page compares the
    two models."""
    result = run_cli_in_process(
        "-m",
        "model=lenet5,capsnet_small",
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
    names = [f"model={model},seed={seed}" for model in ("lenet5", "capsnet_small") for seed in (1, 2)]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == sorted(names)
    for name in names:
        assert any((sweep / name).glob("events.out.tfevents.*")) and not (sweep / name / "tensorboard").exists()
        hparams = hparams_summary(sweep / name)["hparams"]
        model, seed = name.removeprefix("model=").split(",seed=")
        assert (hparams["model"], hparams["data"], hparams["seed"]) == (model, "mnist", int(seed))
    page = (sweep / "README.md").read_text()
    assert "| model=capsnet_small | 2 |" in page and "| model=lenet5 | 2 |" in page
    assert page.index("| model=lenet5 | 2 |") < page.index("| model=capsnet_small | 2 |")  # job order
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

    from capsexp.overrides import hydra_value
    from capsexp.run.resume import expand_run_folder

    checkpoint = tmp_path / "model=capsnet,seed=1" / "checkpoints" / "epoch=0-step=2.ckpt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.touch()
    arguments = expand_run_folder(["train=false", f"ckpt_path={checkpoint}"])
    assert arguments == ["train=false", f"ckpt_path={hydra_value(checkpoint)}"]
    parser = OverridesParser.create()
    for text in [str(checkpoint), "/a b/it's", "C:\\x\\", "/plain/name.ckpt"]:
        assert parser.parse_override(f"ckpt_path={hydra_value(text)}").value() == text


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _last_logged_step(run: Path) -> int:
    """The last step of train/loss_step in ``run``'s event files, read as they are being written."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    steps = [-1]
    for path in sorted(run.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            if any(value.tag == "train/loss_step" for value in event.summary.value):
                steps.append(event.step)
    return max(steps)


# The skipping is the sweeper's, whatever the launcher: the sweep finished in its own process (the basic
# launcher), under joblib and under submitit.
@pytest.mark.parametrize(
    "launcher", ["basic", *(pytest.param(name, marks=pytest.mark.slow) for name in ("joblib", "submitit_local"))]
)
@pytest.mark.slow
def test_a_sweep_killed_outright_during_its_third_job_finishes_when_run_again(launcher, mnist_dir, tmp_path):
    """The whole process group SIGKILLed once the third of four jobs saved a state (a lost machine): the
    command run again, as it printed it, skips the two finished jobs (their folders byte for byte as they
    were), resumes the third from its last.ckpt without logging a step twice, starts the fourth, and
    writes one page over the four. Run again under another launcher, the jobs resume in its processes."""
    sweep = tmp_path / "sweep"
    common = [*TINY_RUN, f"paths.data_dir={mnist_dir}", "trainer.max_steps=30", "trainer.val_check_interval=10"]
    command = [sys.executable, "-m", "capsexp", "-m", "seed=1,2,3,4", *common, f"hydra.sweep.dir={sweep}"]
    environment = {**os.environ, "PYTHONWARNINGS": "ignore"}
    printed_file = tmp_path / "printed.txt"
    with open(printed_file, "w") as printed_to:
        process = subprocess.Popen(
            command, cwd=PROJECT_ROOT, stdout=printed_to, stderr=subprocess.STDOUT, env=environment,
            start_new_session=True,
        )  # fmt: skip
    third = sweep / "seed=3"
    deadline = time.monotonic() + 240
    while not (third / "checkpoints" / "last.ckpt").is_file() and process.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    saved = torch.load(third / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    while _last_logged_step(third) < saved and process.poll() is None:
        time.sleep(0.002)  # until it logged past its saved state: those steps are logged again
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    printed = printed_file.read_text()
    assert process.returncode == -signal.SIGKILL, printed[-2000:]
    assert not (third / FINISHED).exists() and not (sweep / "seed=4").exists()
    # Its printed command: this one, in this sweep's folder.
    line = next(line for line in printed.splitlines() if "if it is stopped, this finishes it: " in line)
    again = shlex.split(line.split("this finishes it: ")[1])
    assert again == ["python", "-m", "capsexp", *command[3:]]
    before = {name: _files(sweep / name) for name in ("seed=1", "seed=2")}
    stepped = torch.load(third / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert 0 < stepped < 30
    assert max(s.step for s in scalars(third)["train/loss_step"]) >= stepped  # logged past its state

    if launcher == "basic":
        result = run_cli_in_process(*again[3:])
    else:
        result = run_cli(
            *again[3:], f"hydra/launcher={launcher}", *(["hydra.launcher.n_jobs=1"] * (launcher == "joblib"))
        )
    assert result.returncode == 0, result.stderr[-3000:]
    said = result.stderr + result.stdout
    assert "2 finished (skipped), 1 resumed from their last.ckpt, 1 started" in said
    assert {name: _files(sweep / name) for name in ("seed=1", "seed=2")} == before
    validated = {}
    for seed in (1, 2, 3, 4):
        logged = scalars(sweep / f"seed={seed}")
        assert len(logged["test/acc"]) == 1
        steps = [s.step for s in logged["train/loss_step"]]
        assert steps == list(range(30)), seed  # each step once, the third job's included
        validated[seed] = [s.step for s in logged["val/acc"]]
    assert validated[3] == validated[1] == validated[4] and len(validated[1]) == len(set(validated[1])) == 2
    assert "Resuming this job from" in (third / "capsexp.log").read_text()
    assert "| 4 |" in (sweep / "README.md").read_text()  # one page, over the four runs


@pytest.mark.slow
def test_ctrl_c_in_a_sweep_ends_with_the_command_that_finishes_the_whole_sweep(mnist_dir, tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) while the second of three jobs trains:
    the job says where its state is and defers to the sweep's command, and the last line printed is that
    command. Pasted as printed, it skips the first job, resumes the second and runs the third: every
    job's folder ends finished."""
    sweep = tmp_path / "sweep"
    common = [*TINY_RUN, f"paths.data_dir={mnist_dir}", "trainer.max_steps=40", "trainer.val_check_interval=10"]
    command = [sys.executable, "-m", "capsexp", "-m", "seed=1,2,3", *common, f"hydra.sweep.dir={sweep}"]
    with open(tmp_path / "stdout.txt", "w") as stdout, open(tmp_path / "stderr.txt", "w") as stderr:
        process = subprocess.Popen(
            command, cwd=PROJECT_ROOT, stdout=stdout, stderr=stderr, env={**os.environ, "PYTHONWARNINGS": "ignore"},
            start_new_session=True,
        )  # fmt: skip
    second = sweep / "seed=2"
    deadline = time.monotonic() + 240
    try:
        while not (second / LAST).is_file():  # saved at step 10 of 40: it trains on
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr.txt").read_text()
            time.sleep(0.005)
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=120)
    finally:
        process.kill()
    printed = (tmp_path / "stderr.txt").read_text().strip().splitlines()
    assert process.returncode == 128 + signal.SIGINT, printed[-20:]
    assert (sweep / "seed=1" / FINISHED).is_file() and not (second / FINISHED).exists()
    assert not (sweep / "seed=3").exists()
    stopped_job = next(line for line in printed if line.startswith("SIGINT: training stopped at step "))
    assert f"its state saved in {second / LAST}; the sweep's command, run again, resumes it" in stopped_job
    last = printed[-1]
    assert last.startswith("The sweep stopped; this finishes it (finished jobs skipped, stopped ones resumed): ")
    again = shlex.split(last.split("resumed): ", 1)[1])
    assert again == ["python", "-m", "capsexp", *command[3:]]

    result = run_cli_in_process(*again[3:])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "1 finished (skipped), 1 resumed from their last.ckpt, 1 started" in result.stderr + result.stdout
    assert [(sweep / f"seed={seed}" / FINISHED).is_file() for seed in (1, 2, 3)] == [True, True, True]


def test_a_sweep_folder_is_finished_only_by_the_sweep_that_started_it(mnist_dir, tmp_path):
    """The same hydra.sweep.dir given to a sweep of other settings: refused, naming the job and what differs
    (a location, here the data's folder, may differ: the data sits elsewhere on another machine)."""
    from capsexp.errors import CapsexpError
    from capsexp.run.sweep_resume import check_same_job

    job = tmp_path / "seed=1"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["seed=1", "model=lenet5", "paths.data_dir=/a"]))
    check_same_job(job, ["model=lenet5", "seed=1", "paths.data_dir=/elsewhere"])  # the order, a location
    with pytest.raises(CapsexpError, match=r"there: model=lenet5; now: model=capsnet") as refused:
        check_same_job(job, ["seed=1", "model=capsnet", "paths.data_dir=/a"])
    assert str(job) in str(refused.value) and "hydra.sweep.dir" in str(refused.value)
    with pytest.raises(CapsexpError, match=r"there: none; now: trainer.max_epochs=3"):
        check_same_job(job, ["seed=1", "model=lenet5", "trainer.max_epochs=3"])


def test_a_study_step_after_the_sweep_runs_each_of_its_runs_once(tmp_path):
    """In a sweep run again, a run an after-sweep step made that finished is not made again; one that saved
    a state goes on from it; one never started starts."""
    from capsexp.locations import LAST_CHECKPOINT
    from capsexp.overrides import hydra_value
    from capsexp.run.sweep_resume import after_sweep_arguments, write_finished

    finished, interrupted, new = (tmp_path / name for name in ("finished", "interrupted", "new"))
    finished.mkdir()
    write_finished(finished, {"test/acc": 0.5})
    (interrupted / LAST_CHECKPOINT).parent.mkdir(parents=True)
    (interrupted / LAST_CHECKPOINT).touch()
    arguments = ["model=capsnet", "ckpt_path=/other/best.ckpt"]
    assert after_sweep_arguments([*arguments, f"hydra.run.dir={finished}"], finished) is None
    assert after_sweep_arguments(arguments, interrupted) == [
        "model=capsnet",
        f"ckpt_path={hydra_value(interrupted / LAST_CHECKPOINT)}",
    ]
    assert after_sweep_arguments(arguments, new) == arguments


# A search of LeNet5's learning rate on the shared Optuna settings (capsnet_optuna's search space: the
# two-trial test above): each trial a few seconds.
OPTUNA_TINY = [
    "hparams_search=optuna",
    "model.optimizer.lr=tag(log, interval(0.0005, 0.01))",
    "hydra.sweeper.sampler.n_startup_trials=2",
    "hydra.sweeper.heartbeat_interval=1",
    "hydra.sweeper.grace_period=3",
    *TINY_RUN,
    "trainer.max_steps=40",
    "trainer.val_check_interval=4",
    "~hydra.callbacks.comparison",  # the page: tested with the basic sweeper
]


def _study(storage: str, name: str = "train"):  # hparams_search=optuna's study_name: the task's
    import optuna

    return optuna.load_study(study_name=name, storage=storage)


def _states(storage: str) -> list[str]:
    """The state of each trial of the study, by number (none where the study does not exist yet)."""
    if storage.startswith("sqlite:///") and not Path(storage.removeprefix("sqlite:///")).is_file():
        return []
    try:
        return [trial.state.name for trial in _study(storage).get_trials(deepcopy=False)]
    except Exception:  # no such study yet, or its tables being made
        return []


def _start(arguments: list[str], output: Path) -> subprocess.Popen:
    with open(output, "w") as printed_to:
        return subprocess.Popen(
            [sys.executable, "-m", "capsexp", *arguments], cwd=PROJECT_ROOT, stdout=printed_to,
            stderr=subprocess.STDOUT, env={**os.environ, "PYTHONWARNINGS": "ignore"}, start_new_session=True,
        )  # fmt: skip


@pytest.mark.slow
def test_an_optuna_search_killed_after_two_trials_goes_on_to_its_n_trials(mnist_dir, tmp_path):
    """A search's study lives in the sweep folder's SQLite file: SIGKILLed while its third trial runs, the
    search run again by the command it printed ends with n_trials trials told. The killed trial is failed
    once its heartbeat is older than the grace period, its parameters run again in its job folder, going on
    from its last.ckpt."""
    sweep = tmp_path / "search"
    arguments = [*OPTUNA_TINY, f"paths.data_dir={mnist_dir}", "hydra.sweeper.n_trials=4", f"hydra.sweep.dir={sweep}"]
    # Trials of about 2 s on a quiet machine: at 40 steps the third trial once ended between two polls.
    arguments.append("trainer.max_steps=160")
    storage = f"sqlite:///{sweep}/optuna.db"
    process = _start(arguments, tmp_path / "printed.txt")
    deadline = time.monotonic() + 240
    while not (_states(storage)[:3] == ["COMPLETE", "COMPLETE", "RUNNING"] and (sweep / "2" / LAST).is_file()):
        assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "printed.txt").read_text()[-3000:]
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    line = next(l for l in (tmp_path / "printed.txt").read_text().splitlines() if "if it is stopped, or add a" in l)
    again = shlex.split(line.split("add a worker to it: ")[1])
    assert again[:3] == ["python", "-m", "capsexp"] and f"hydra.sweep.dir={sweep}" in again
    killed = _study(storage).trials[2].params

    result = run_cli_in_process(*again[3:])
    assert result.returncode == 0, result.stderr[-3000:]
    trials = _study(storage).get_trials(deepcopy=False)
    assert [t.state.name for t in trials].count("COMPLETE") == 4
    # The killed trial: failed for its heartbeat, its parameters run again (once) in its folder, from its state.
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == 2]
    assert trials[2].state.name == "FAIL" and retry.state.name == "COMPLETE" and retry.params == killed
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1", "2", "3"]
    assert "Resuming this job from" in (sweep / "2" / "capsexp.log").read_text()
    assert all((sweep / name / FINISHED).is_file() for name in ("0", "1", "2", "3"))
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())["best_value"]
    assert best == max(t.value for t in trials if t.value is not None)


@pytest.mark.slow
def test_ctrl_c_in_an_optuna_search_ends_with_the_command_that_finishes_it(mnist_dir, tmp_path):
    """Ctrl-C while the second trial trains: exit 130 without a traceback, the last line the search's
    finishing command (its sweep folder and storage), which the printed "if it is stopped" line names too."""
    sweep = tmp_path / "search"
    arguments = [*OPTUNA_TINY, f"paths.data_dir={mnist_dir}", "hydra.sweeper.n_trials=3", f"hydra.sweep.dir={sweep}"]
    arguments.append("trainer.max_steps=160")
    process = _start(arguments, tmp_path / "printed.txt")
    deadline = time.monotonic() + 240
    while not (sweep / "1" / LAST).is_file():
        assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "printed.txt").read_text()[-3000:]
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGINT)
    process.wait(timeout=120)
    printed = (tmp_path / "printed.txt").read_text().strip().splitlines()
    assert process.returncode == 128 + signal.SIGINT and "Traceback" not in "\n".join(printed), printed[-20:]
    start = "The search stopped; this finishes it (the stopped trial retried from its saved state once its heartbeat"
    assert printed[-1].startswith(start), printed[-5:]
    again = shlex.split(printed[-1].split(" s old): ", 1)[1])
    announced = next(line for line in printed if "if it is stopped, or add a worker to it: " in line)
    assert again == shlex.split(announced.split("add a worker to it: ")[1])
    assert again[:3] == ["python", "-m", "capsexp"] and f"hydra.sweep.dir={sweep}" in again
    assert f"hydra.sweeper.storage=sqlite:///{sweep}/optuna.db" in again


def _two_workers_share_one_study(arguments: list[str], storage: str, tmp_path: Path) -> None:
    """Two workers on the study at once, one a process of its own, one this test's; assert they ran n_trials=6
    trials between them, each once.

    The other worker is paused from its first trial until this one has asked for its own, so that both take
    part however loaded the machine (unpaused, six tiny trials can all end before this worker joins). The
    grace period outlasts the pause: a paused worker's trial is not taken for a dead one's."""
    import threading

    arguments = [*arguments, "hydra.sweeper.grace_period=600", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    other = _start(arguments, tmp_path / "1.txt")
    deadline = time.monotonic() + 120
    while not _states(storage):  # this one joins once the other runs its first trial
        assert other.poll() is None and time.monotonic() < deadline, (tmp_path / "1.txt").read_text()[-3000:]
        time.sleep(0.05)
    os.killpg(other.pid, signal.SIGSTOP)

    def resume_other() -> None:  # once this worker has its trial (or after a minute, not to hang the test)
        until = time.monotonic() + 60
        while len(_states(storage)) < 2 and time.monotonic() < until:
            time.sleep(0.05)
        os.killpg(other.pid, signal.SIGCONT)

    resumer = threading.Thread(target=resume_other, daemon=True)
    resumer.start()
    here = run_cli_in_process(*arguments)
    resumer.join()
    (tmp_path / "2.txt").write_text(here.stdout + here.stderr)
    assert here.returncode == 0 and other.wait(timeout=600) == 0, (tmp_path / "1.txt").read_text()[-3000:]
    trials = _study(storage).get_trials(deepcopy=False)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 6
    launched = [
        line.split("#", 1)[1].split(" :")[0]
        for w in (1, 2)
        for line in (tmp_path / f"{w}.txt").read_text().splitlines()
        if "\t#" in line
    ]
    assert sorted(launched, key=int) == [str(n) for n in range(6)]  # every trial launched once, by one worker
    assert all((tmp_path / "sweep" / str(n) / FINISHED).is_file() for n in range(6))
    assert all(any("\t#" in line for line in (tmp_path / f"{w}.txt").read_text().splitlines()) for w in (1, 2))


# The workers' loop is the same on every database: a PostgreSQL study (below), and the SQLite file a search
# keeps by default.
@pytest.mark.slow
def test_two_workers_share_one_sqlite_study_without_repeating_a_trial(mnist_dir, tmp_path):
    arguments = [*OPTUNA_TINY, f"paths.data_dir={mnist_dir}", "hydra.sweeper.n_trials=6"]
    _two_workers_share_one_study(arguments, f"sqlite:///{tmp_path / 'sweep'}/optuna.db", tmp_path)


@pytest.fixture
def postgresql(tmp_path_factory) -> Iterator[str]:
    """A PostgreSQL server of Debian's package, started in a temporary folder (as the ``postgres`` user
    where the tests run as root: the server refuses root), listening on a socket there; its URL."""
    import pwd
    import shutil

    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("no PostgreSQL server here (initdb and pg_ctl not on PATH; Debian: apt install postgresql)")
    folder = tmp_path_factory.mktemp("postgresql")
    run_as: list[str] = []
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root, and no postgres user to run the server as")
        run_as = ["runuser", "-u", "postgres", "--"]
        for path in (folder, *folder.parents):  # the server's user must reach its folder
            if path == Path(tempfile.gettempdir()).parent:
                break
            os.chmod(path, os.stat(path).st_mode | 0o011)
        os.chown(folder, user.pw_uid, user.pw_gid)
    data, socket = folder / "data", folder
    subprocess.run([*run_as, initdb, "-D", str(data), "-U", "capsexp", "--auth=trust"], check=True, capture_output=True)
    options = f"-k {socket} -c listen_addresses='' -p 5439"
    # Its log to a file: the server would hold a pipe open, and the command's output never end.
    start = [*run_as, pg_ctl, "-D", str(data), "-o", options, "-l", str(folder / "server.log"), "-w", "start"]
    subprocess.run(start, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"postgresql://capsexp@/postgres?host={socket}&port=5439"
    finally:
        subprocess.run([*run_as, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True)


@pytest.mark.slow
def test_two_workers_share_one_postgresql_study_without_repeating_a_trial(postgresql, mnist_dir, tmp_path):
    """Workers on several machines share a study in a real database: here two processes on one server."""
    arguments = [*OPTUNA_TINY, f"paths.data_dir={mnist_dir}", "hydra.sweeper.n_trials=6"]
    _two_workers_share_one_study([*arguments, f"hydra.sweeper.storage={hydra_value(postgresql)}"], postgresql, tmp_path)


def test_a_finished_job_is_skipped_even_where_it_kept_its_saved_state(tmp_path):
    """A job folder's state: finished (metrics.yaml written, its last.ckpt kept, as every finished run keeps
    it) is skipped; a saved state alone is resumed; neither, started."""
    from capsexp.locations import LAST_CHECKPOINT
    from capsexp.run.sweep_resume import RESUMED, SKIPPED, STARTED, job_state, write_finished

    finished, stopped, new = (tmp_path / name for name in ("finished", "stopped", "new"))
    for folder in (finished, stopped):
        (folder / LAST_CHECKPOINT).parent.mkdir(parents=True)
        (folder / LAST_CHECKPOINT).touch()
    write_finished(finished, {"test/acc": 0.5})
    assert [job_state(folder) for folder in (finished, stopped, new)] == [SKIPPED, RESUMED, STARTED]


def test_the_finishing_command_pasted_into_a_shell_is_the_sweep_as_typed(tmp_path, monkeypatch):
    """The printed command, split as a shell splits it, gives back each argument as typed: an override with
    a space, a list, a quote and an interpolation's $ (what the user quoted for their shell), and the
    sweep's folder as Hydra reads it."""
    from capsexp.overrides import value
    from capsexp.run.sweep_resume import finishing_command

    typed = ["-m", "seed=1,2", "model.net.conv_layers=[4,4]", "tags=[my run]", "task_name=it's", "x=${oc.env:HOME}"]
    monkeypatch.setattr(sys, "argv", ["capsexp", *typed, "hydra.sweep.dir=/old"])
    sweep = tmp_path / "my sweep=a,b"
    pasted = shlex.split(finishing_command(sweep))
    assert pasted[:3] == ["python", "-m", "capsexp"] and pasted[3:-1] == typed
    assert value(pasted[-1]) == str(sweep)


def test_a_search_counts_the_trials_a_job_failed_not_those_a_dead_worker_left():
    """Toward n_trials: finished, pruned, running, and failed by their job; not a trial failed for its
    heartbeat (a dead worker's), whose retry takes its place."""
    import optuna
    from optuna.trial import TrialState

    from capsexp.run.optuna_search import JOB_FAILED, _counted

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    complete, pruned, by_job, by_heartbeat, _running = (study.ask() for _ in range(5))
    study.tell(complete, 1.0)
    study.tell(pruned, state=TrialState.PRUNED)
    study._storage.set_trial_system_attr(by_job._trial_id, JOB_FAILED, True)
    study.tell(by_job, state=TrialState.FAIL)
    study.tell(by_heartbeat, state=TrialState.FAIL)
    assert _counted(study) == 4


def test_a_retried_trial_runs_as_the_job_of_the_trial_it_retries():
    """Trials 4-6 asked, 4 retrying trial 1 (a dead worker's, whose job folder holds its saved state): job 1
    is launched for it, then jobs 5 and 6 together (consecutive numbers: one launch)."""
    import optuna

    from capsexp.run.optuna_search import ResumableSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    for _ in range(4):
        study.tell(study.ask(), 0.0)
    trials = [study.ask() for _ in range(3)]
    study._storage.set_trial_system_attr(trials[0]._trial_id, "failed_trial", 1)
    launched = []
    search = object.__new__(ResumableSearch)
    search.launcher = types.SimpleNamespace(
        launch=lambda overrides, initial_job_idx: launched.append((list(overrides), initial_job_idx)) or []
    )
    search._launch_numbered(trials, [["a=4"], ["a=5"], ["a=6"]])
    assert launched == [([["a=4"]], 1), ([["a=5"], ["a=6"]], 5)]
