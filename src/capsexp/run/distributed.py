"""Lightning's DDP processes under Hydra: each job's extra ranks run that job, once, in its folder.

With ``trainer.devices=N`` (and ``num_nodes=1``, no torchrun or SLURM), Lightning's subprocess
launcher starts ranks 1..N-1 by re-running the command line. Under Hydra it re-uses ``sys.argv``,
which breaks in three ways (Lightning-AI/pytorch-lightning#11300,
ashleve/lightning-hydra-template#393):

- in a multirun, ``sys.argv`` holds ``-m`` and the whole sweep, so every child starts the sweep again;
- a child writes to ``hydra.run.dir``, which in a multirun is not the job's folder;
- a launcher process running several jobs (the basic launcher runs them one after another) keeps the
  first job's ``LOCAL_RANK``/``WORLD_SIZE``/``MASTER_PORT``, process group and thread count, so the
  next job believes its ranks are started externally and waits for them forever.

:func:`ddp_job` fixes all three for the length of one job: children are started as a single run of
this job's own overrides (``hydra.overrides.task``) in this job's output folder, and afterwards the
environment, the thread count and the process group are as they were, and the children have exited.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import lightning as L
import torch
import torch.distributed
from lightning.fabric.strategies.launchers import subprocess_script as fabric_launcher
from lightning.pytorch.strategies.launchers import subprocess_script as trainer_launcher

# What Lightning's launcher writes into this process's environment (and torch.set_num_threads).
LAUNCH_ENVIRONMENT = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE", "OMP_NUM_THREADS")


def child_process_command(local_rank: int, extra: Sequence[str] = ()) -> tuple[Sequence[str], str]:
    """``python -m capsexp <this job's overrides> <extra>`` as a single run in this job's folder.

    Stands in for ``_hydra_subprocess_cmd`` of Lightning's subprocess launchers (Fabric's, and the
    Trainer's, which imports it by name); returns the command and its working directory, as it does.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.utils import get_original_cwd

    hydra_cfg = HydraConfig.get()
    command = [sys.executable, "-m", "capsexp"]
    for source in hydra_cfg.runtime.config_sources:
        if source.provider == "command-line":  # --config-dir
            command += ["--config-dir", source.path.removeprefix("file://")]
    command += ["--config-name", hydra_cfg.job.config_name]
    command += [*hydra_cfg.overrides.task, *extra]
    command += [
        f'hydra.run.dir="{hydra_cfg.runtime.output_dir}"',
        f"hydra.job.name={hydra_cfg.job.name}_rank{local_rank}",  # its log file: <job name>_rank<k>.log
        "hydra.output_subdir=null",  # .hydra/ is the launching process's
    ]
    return command, get_original_cwd()


class DDPJob:
    """Handle yielded by :func:`ddp_job`; :meth:`watch` the trainer so that its children are awaited."""

    def __init__(self) -> None:
        self.trainers: list[L.Trainer] = []

    def watch(self, trainer: L.Trainer) -> None:
        self.trainers.append(trainer)

    def child_processes(self) -> list[subprocess.Popen]:
        launchers = [getattr(trainer.strategy, "launcher", None) for trainer in self.trainers]
        return [process for launcher in launchers for process in getattr(launcher, "procs", [])]


@contextmanager
def ddp_job(extra: Sequence[str] = ()) -> Iterator[DDPJob]:
    """Run one job whose trainer may start DDP child processes; see the module docstring. ``extra``:
    overrides the children get after the job's own (the checkpoint a resumed job goes on from).

    On exit the watched trainers' children are awaited (killed if the job failed: they would wait
    in a collective forever), then the process group, environment and thread count are restored.
    """
    job = DDPJob()
    saved_environment = {name: os.environ.get(name) for name in LAUNCH_ENVIRONMENT}
    saved_threads = torch.get_num_threads()
    launcher_modules = (fabric_launcher, trainer_launcher)
    original_commands = [module._hydra_subprocess_cmd for module in launcher_modules]
    for module in launcher_modules:
        module._hydra_subprocess_cmd = functools.partial(child_process_command, extra=tuple(extra))
    failed = True
    try:
        yield job
        failed = False
    finally:
        for module, original_command in zip(launcher_modules, original_commands, strict=True):
            module._hydra_subprocess_cmd = original_command
        for child in job.child_processes():
            if failed:
                child.kill()
            child.wait()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        for name, value in saved_environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        torch.set_num_threads(saved_threads)
