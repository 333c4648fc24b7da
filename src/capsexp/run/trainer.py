"""The run's Trainer: its callbacks and loggers from the config, the steps a resumed run logs again hidden
in the folder's earlier files, and Lightning's own progress bar and summary only where the config has one."""

from __future__ import annotations

import logging
import os

import lightning as L
from lightning.pytorch.callbacks import ModelSummary, ProgressBar
from omegaconf import DictConfig

from capsexp.config.instantiation import instantiate, instantiate_all
from capsexp.run.preparation import Prepared
from capsexp.run.run_folder import StepSeen, steps_to_hide

log = logging.getLogger(__name__)


def build_trainer(cfg: DictConfig, prepared: Prepared) -> L.Trainer:
    """The Trainer of ``cfg.trainer`` with the config's callbacks and loggers, at the prepared precision; a
    :class:`~capsexp.run.run_folder.StepSeen` among its callbacks."""
    callbacks = instantiate_all("callbacks", cfg.get("callbacks"))
    folder = prepared.folder
    hidden = steps_to_hide(folder, cfg.get("ckpt_path")) if folder is not None else None
    if hidden is not None and int(os.environ.get("LOCAL_RANK", 0)) == 0:
        log.info(f"Events this folder holds from step {hidden} on are hidden: this run logs them again")
    purge = {"purge_step": hidden}
    loggers = instantiate_all(
        "logger",
        cfg.get("logger"),
        {"TensorBoardLogger": purge, "ResumableCSVLogger": purge} if hidden is not None else None,
    )
    # A progress bar or model summary dropped from the callbacks (callbacks.progress_bar=null) is gone:
    # Lightning would otherwise add its own default one.
    shown = {
        "enable_progress_bar": any(isinstance(c, ProgressBar) for c in callbacks),
        "enable_model_summary": any(isinstance(c, ModelSummary) for c in callbacks),
    }
    trainer = instantiate(
        "trainer",
        cfg.trainer,
        callbacks=[*callbacks, StepSeen()],
        logger=loggers or False,
        precision=prepared.precision.lightning,
        **shown,
    )
    _warn_if_more_processes_than_cores(trainer)
    return trainer


def _warn_if_more_processes_than_cores(trainer: L.Trainer) -> None:
    """CPU processes beyond the cores share them: each step waits for the slowest, so the run is slower
    than with fewer processes (two threads each on two busy cores ran ten times slower)."""
    from lightning.pytorch.accelerators import CPUAccelerator

    cores = os.cpu_count() or 1
    if isinstance(trainer.accelerator, CPUAccelerator) and trainer.num_devices > cores and trainer.is_global_zero:
        log.warning(
            f"trainer.devices={trainer.num_devices} runs {trainer.num_devices} processes on {cores} CPU cores: "
            f"they share the cores and the run is slower than with trainer.devices={cores} or fewer"
        )
