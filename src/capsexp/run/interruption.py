"""A run a signal stopped: the error that names its saved state and the command that resumes it."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import lightning as L
from hydra.core.hydra_config import HydraConfig

from capsexp.callbacks.model_checkpoint import requeue_signal
from capsexp.errors import Interrupted
from capsexp.locations import LAST_CHECKPOINT, shown_path
from capsexp.overrides import hydra_value, without
from capsexp.run import slurm
from capsexp.run.run_folder import run_folder, single_run


def raise_if_stopped_by_signal(trainer: L.Trainer) -> None:
    """:class:`Interrupted`, with the saved state's path and the command that resumes it, when a
    signal ended training (:class:`~capsexp.callbacks.model_checkpoint.BestAndLastCheckpoint`). On SLURM's
    requeue signal the job is requeued first (:mod:`capsexp.run.slurm`)."""
    stopped = next((cb for cb in trainer.checkpoint_callbacks if getattr(cb, "stopped_by", None)), None)
    if stopped is None:
        return
    if trainer.global_rank != 0:  # one line, from the first process
        sys.exit(128 + stopped.stopped_by)
    last = Path(stopped.last_model_path).resolve()
    folder = run_folder()
    if folder is not None and last == folder / LAST_CHECKPOINT:
        resume = ["python", "-m", "capsexp", f"ckpt_path={shown_path(folder)}"]  # capsexp.run.resume
    else:  # a checkpoint outside the run folder: the run's overrides, then the file
        overrides = HydraConfig.get().overrides.task if folder is not None else []
        resume = ["python", "-m", "capsexp", *without(overrides, "ckpt_path")]
        resume.append(f"ckpt_path={hydra_value(shown_path(last))}")
    next_step = f"resume with: {shlex.join(resume)}"
    if not single_run():  # a sweep's job: the sweep's own command finishes it and the jobs after it
        next_step = "the sweep's command, run again, resumes it from there"
    job = slurm.job_id()
    if stopped.stopped_by == requeue_signal(trainer) and job is not None:
        if folder is None or not single_run():
            next_step = f"SLURM job {job} not requeued (only a single run resumes in its folder); {next_step}"
        elif (status := slurm.requeue(job)) == 0:
            next_step = f"SLURM job {job} requeued: it resumes in {shown_path(folder)}"
        else:
            next_step = f"requeuing SLURM job {job} failed (scontrol requeue: exit status {status}); {next_step}"
    raise Interrupted(
        f"{stopped.stopped_by.name}: training stopped at step {trainer.global_step}, its state saved in "
        f"{shown_path(last)}; {next_step}",
        stopped.stopped_by,
    )
