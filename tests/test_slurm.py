"""SLURM: the requeue signal saves the state and requeues the job, which resumes in its own run folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch

from capsexp.run import slurm
from capsexp.run.resume import LAST_CHECKPOINT
from tests.helpers import PROJECT_ROOT, TINY_RUN

JOB = "4242"
# What SLURM sets in a batch job of one task (Lightning's SLURMEnvironment reads them).
SLURM_JOB = {
    "SLURM_JOB_ID": JOB,
    "SLURM_JOB_NAME": "capsexp-test",
    "SLURM_NTASKS": "1",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NODELIST": "localhost",
}


@pytest.fixture
def slurm_job(monkeypatch) -> None:
    for name in [name for name in os.environ if name.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    for name, value in SLURM_JOB.items():
        monkeypatch.setenv(name, value)


def test_job_id_is_the_one_scontrol_takes(slurm_job, monkeypatch):
    assert slurm.job_id() == JOB
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "100")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "7")
    assert slurm.job_id() == "100_7"
    monkeypatch.setenv("SLURM_JOB_NAME", "interactive")  # an interactive allocation: not a batch job
    assert slurm.job_id() is None
    monkeypatch.delenv("SLURM_JOB_ID")
    assert slurm.job_id() is None


def test_only_a_restarted_job_with_a_saved_state_resumes_its_folder(slurm_job, monkeypatch, tmp_path):
    arguments = [f"paths.log_dir={tmp_path}", "model=lenet5"]
    run_folder = tmp_path / "train" / "runs" / "2026-01-01_00-00-00"
    record = slurm.record_run_folder(tmp_path, "train", run_folder)
    assert record == tmp_path / "train" / slurm.RUN_FOLDERS / JOB and record.read_text().strip() == str(run_folder)
    assert slurm.resume_if_restarted(arguments) == arguments  # the first start

    monkeypatch.setenv(slurm.RESTART_COUNT, "1")
    assert slurm.resume_if_restarted(arguments) == arguments  # nothing saved yet: start again
    (run_folder / LAST_CHECKPOINT).parent.mkdir(parents=True)
    (run_folder / LAST_CHECKPOINT).touch()
    assert slurm.resume_if_restarted(arguments) == [*arguments, f"ckpt_path={run_folder}"]
    assert slurm.resume_if_restarted(["-m", *arguments]) == ["-m", *arguments]  # a sweep is not resumed
    monkeypatch.setenv("SLURM_JOB_ID", "4243")  # another job's restart
    assert slurm.resume_if_restarted(arguments) == arguments


@pytest.mark.slow  # 16 s of two CLI runs: make test-all; the requeue call and the resume are tested on their own
def test_the_requeue_signal_saves_requeues_and_the_restarted_job_resumes_in_its_folder(mnist_dir, tmp_path):
    # A fake scontrol that notes how it was called.
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol_calls"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    environment = {name: value for name, value in os.environ.items() if not name.startswith("SLURM_")}
    environment |= SLURM_JOB | {"PATH": f"{bin_dir}{os.pathsep}{environment['PATH']}"}
    log_dir = tmp_path / "logs"
    # The same command both times, as SLURM starts the batch script again.
    command = [sys.executable, "-m", "capsexp", *TINY_RUN, f"paths.data_dir={mnist_dir}", f"paths.log_dir={log_dir}"]
    command += ["model=lenet5", "trainer.max_epochs=10000", "callbacks.progress_log.interval_s=0.2"]

    def start_then_signal(signum: signal.Signals, environment: dict[str, str]) -> tuple[int, str]:
        process = subprocess.Popen(
            command, cwd=PROJECT_ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            for line in process.stdout:  # the first progress line: training has begun
                if "| step " in line:
                    break
            process.send_signal(signum)
            _, stderr = process.communicate(timeout=120)
        finally:
            process.kill()
        return process.returncode, stderr

    status, stderr = start_then_signal(signal.SIGUSR1, environment)
    assert status == 128 + signal.SIGUSR1, stderr[-3000:]
    (run_folder,) = (log_dir / "train" / "runs").iterdir()
    first_step = torch.load(run_folder / LAST_CHECKPOINT, weights_only=True)["global_step"]
    assert stderr.strip().splitlines()[-1] == (
        f"SIGUSR1: training stopped at step {first_step}, its state saved in {run_folder / LAST_CHECKPOINT}; "
        f"SLURM job {JOB} requeued: it resumes in {run_folder}"
    )
    assert calls.read_text() == f"requeue {JOB}\n"

    # SLURM starts the requeued job again; this time the scheduler pre-empts it with SIGTERM.
    status, stderr = start_then_signal(signal.SIGTERM, environment | {slurm.RESTART_COUNT: "1"})
    assert status == 128 + signal.SIGTERM, stderr[-3000:]
    assert f"SLURM job {JOB} restarted: resuming {run_folder}" in stderr
    assert list((log_dir / "train" / "runs").iterdir()) == [run_folder]  # no new folder
    assert torch.load(run_folder / LAST_CHECKPOINT, weights_only=True)["global_step"] > first_step
    assert calls.read_text() == f"requeue {JOB}\n"  # SIGTERM does not requeue: SLURM does, for --requeue


def test_requeue_asks_scontrol_to_requeue_the_job_and_returns_its_exit_status(tmp_path, monkeypatch):
    tools = tmp_path / "bin"
    tools.mkdir()
    calls = tmp_path / "calls"
    scontrol = tools / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexit 3\n')
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    assert slurm.requeue("4242") == 3
    assert calls.read_text() == "requeue 4242\n"
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert slurm.requeue("4242") == 127  # no scontrol: the shell's "command not found"
