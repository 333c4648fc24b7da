"""SLURM pre-emption and time limits: the job saves its state, requeues itself, and resumes in its folder.

Lightning, on SLURM, requeues a batch job (``scontrol requeue``) when the requeue signal arrives
(``SLURMEnvironment.requeue_signal``, SIGUSR1 unless set; ``#SBATCH --signal=SIGUSR1@90`` has SLURM
send it 90 s before the time limit), and the requeued job looks for its state in its
``default_root_dir``. Under Hydra every start makes a new run folder, so the requeued job would start
over. Here instead:

- a single run records its run folder under its job id, ``<log_dir>/<task_name>/slurm/<job id>``;
- the requeue signal ends training as SIGTERM does, after the current step with ``last.ckpt``
  written (:class:`~capsexp.callbacks.model_checkpoint.BestAndLastCheckpoint`); then the job is requeued;
- a restarted job (``SLURM_RESTART_COUNT`` above 0) whose id has a recorded folder resumes that
  folder as ``ckpt_path=<run folder>`` does (:mod:`capsexp.run.resume`): same config, same folder,
  TensorBoard curves continued.

A ``--requeue`` job that SLURM pre-empts (SIGTERM, then requeued by SLURM itself) resumes the same
way. A sweep (``-m``) inside one job is not requeued: its jobs resume one by one with
``ckpt_path=<job folder>``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from capsexp.run.resume import LAST_CHECKPOINT, MULTIRUN_FLAGS, task_folder

RESTART_COUNT = "SLURM_RESTART_COUNT"  # set by SLURM in a requeued job: how often it restarted
RUN_FOLDERS = "slurm"  # under <log_dir>/<task_name>: one file per job id, holding its run folder


def job_id() -> str | None:
    """This job's id as ``scontrol`` takes it (``<array job>_<task>`` for an array task); None
    when not running as a SLURM job the way Lightning detects one (not under an interactive
    allocation's ``bash``)."""
    if "SLURM_JOB_ID" not in os.environ:
        return None  # without importing Lightning (and torch): the command line's --help stays quick
    from lightning.fabric.plugins.environments import SLURMEnvironment

    if not SLURMEnvironment.detect():
        return None
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array_job is not None and "SLURM_ARRAY_TASK_ID" in os.environ:
        return f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def record_run_folder(log_dir: str | Path, task_name: str, run_folder: Path) -> Path | None:
    """Note ``run_folder`` as this job's, for its restarts; the file written (None outside SLURM)."""
    job = job_id()
    if job is None:
        return None
    record = Path(log_dir) / task_name / RUN_FOLDERS / job
    record.parent.mkdir(parents=True, exist_ok=True)
    partial = record.with_name(record.name + ".partial")
    partial.write_text(f"{run_folder.resolve()}\n")
    os.replace(partial, record)
    return record


def requeue(job: str) -> int:
    """``scontrol requeue <job>``; its exit status (127 when ``scontrol`` is not found)."""
    try:
        return subprocess.call(["scontrol", "requeue", job])
    except FileNotFoundError:
        return 127


def resume_if_restarted(arguments: list[str]) -> list[str]:
    """``arguments`` plus ``ckpt_path=<run folder>`` when this is a restart of a SLURM job whose
    earlier start recorded a run folder with a saved state; otherwise unchanged."""
    job = job_id()
    if job is None or int(os.environ.get(RESTART_COUNT) or 0) == 0:
        return arguments
    if any(argument in MULTIRUN_FLAGS for argument in arguments):
        return arguments
    record = task_folder(arguments, f"SLURM job {job} restarted") / RUN_FOLDERS / job
    if not record.is_file():
        return arguments
    folder = Path(record.read_text().strip())
    first_process = os.environ.get("SLURM_PROCID", "0") == "0"
    if not (folder / LAST_CHECKPOINT).is_file():
        if first_process:
            print(f"SLURM job {job} restarted; its run {folder} saved no state: starting again", file=sys.stderr)
        return arguments
    if first_process:
        print(f"SLURM job {job} restarted: resuming {folder}", file=sys.stderr)
    return [*arguments, f"ckpt_path={folder}"]  # a folder: expand_run_folder reads it as given
