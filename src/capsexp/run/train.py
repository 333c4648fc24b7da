"""``run(cfg)``: build everything from the composed config, train, test the best checkpoint."""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.callbacks import Callback, ModelSummary, ProgressBar
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig, OmegaConf

from capsexp.callbacks.model_checkpoint import requeue_signal
from capsexp.config.precision import resolve as resolve_precision
from capsexp.config.precision import routing_of
from capsexp.config.run_record import RunRecord
from capsexp.errors import Interrupted
from capsexp.locations import hydra_value
from capsexp.results.machine import describe as describe_machine
from capsexp.results.machine import write_machine
from capsexp.results.metric_names import MODEL_FLOPS, MODEL_PARAMETERS, VAL_ACC_BEST
from capsexp.results.model_card import CardFacts, write_model_card
from capsexp.results.revision import at_import, of_this_process, write_revision
from capsexp.run import slurm
from capsexp.run.build import (
    build_model,
    instantiate,
    instantiate_all,
    lightning_settings_named,
    quiet_lightning_notices,
)
from capsexp.run.checkpoints import check_checkpoint
from capsexp.run.distributed import DDPJob, ddp_job
from capsexp.run.hparams import log_hyperparameters, run_choices
from capsexp.run.model_cost import forward_flops_per_image, parameter_count
from capsexp.run.resume import LAST_CHECKPOINT
from capsexp.run.run_folder import (
    StepSeen,
    no_files_left_if_failed_early,
    say_run_folder,
    shown_path,
    steps_to_hide,
)
from capsexp.run.sweep_resume import write_finished

if TYPE_CHECKING:
    from capsexp.attacks.evaluation import AdversarialEvaluation

log = logging.getLogger(__name__)
# The code this process runs, read as it imports it: each job it runs records this (of_this_process).
at_import()


def _quiet_duplicate_console() -> None:
    """``import lightning`` gives its logger a console handler of its own; when the root logger
    already prints (Hydra's, which also writes the run's log file), each line would show twice.
    Lightning's notices (:data:`~capsexp.run.build.LIGHTNING_NOTICES`) are left out."""
    if logging.getLogger().hasHandlers():
        lightning_logger = logging.getLogger("lightning")
        for handler in list(lightning_logger.handlers):
            lightning_logger.removeHandler(handler)
    quiet_lightning_notices()


def run(cfg: DictConfig) -> dict[str, float]:
    """Seed, instantiate data, model, callbacks, loggers and trainer; fit; test; return the metrics.

    With ``trainer.devices > 1`` every process runs this; the returned metrics are reduced over all
    of them (the same on every rank).
    """
    # The extra processes of a DDP job go on from the state the job goes on from (capsexp.run.sweep_resume).
    with ddp_job([f"ckpt_path={hydra_value(cfg.ckpt_path)}"] if cfg.get("ckpt_path") else []) as job:
        return _run(cfg, job)


def _run(cfg: DictConfig, job: DDPJob) -> dict[str, float]:
    _quiet_duplicate_console()
    # Raised inside Lightning 2.6 by torch 2.14 on every run; nothing a user can act on.
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    run_folder = _run_folder()
    revision = of_this_process()
    model = HydraConfig.get().runtime.choices.get("model") if HydraConfig.initialized() else None
    precision = resolve_precision(
        cfg.trainer.get("precision"), model, routing_of(cfg.model), cfg.trainer.get("accelerator")
    )
    if run_folder is not None and int(os.environ.get("LOCAL_RANK", 0)) == 0:
        say_run_folder(run_folder, finished=False)
        write_machine(run_folder, precision.lightning)
        revision = write_revision(run_folder, revision)  # with the code of the run's earlier parts, if resumed
    if cfg.get("seed") is not None:
        L.seed_everything(cfg.seed, workers=True)
    if torch.cuda.is_available():
        torch.set_float32_matmul_precision(cfg.get("float32_matmul_precision") or "highest")

    # Plain containers for the data too: Lightning saves its arguments in checkpoints as well.
    datamodule: L.LightningDataModule = instantiate("data", cfg.data, _convert_="all")
    module: L.LightningModule = build_model("model", cfg.model)
    # Every checkpoint carries what rebuilds its model and preprocessing, and the code that trained it.
    module.run_record = RunRecord(
        config=OmegaConf.to_container(cfg, resolve=True),
        overrides=list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else [],
        revision=revision,
    )
    if cfg.get("ckpt_path"):
        check_checkpoint(cfg.ckpt_path, module)
    # Built before training, so that a bad attack option fails now, not after hours of training.
    attack = instantiate("attack", cfg.attack) if cfg.get("attack") else None
    callbacks: list[Callback] = instantiate_all("callbacks", cfg.get("callbacks"))
    hidden = steps_to_hide(run_folder, cfg.get("ckpt_path")) if run_folder is not None else None
    if hidden is not None and run_folder is not None and int(os.environ.get("LOCAL_RANK", 0)) == 0:
        log.info(f"Events this folder holds from step {hidden} on are hidden: this run logs them again")
    loggers: list[Logger] = instantiate_all(
        "logger",
        cfg.get("logger"),
        {"TensorBoardLogger": {"purge_step": hidden}, "ResumableCSVLogger": {"purge_step": hidden}}
        if hidden is not None
        else None,
    )
    step_seen = StepSeen()
    # A progress bar or model summary dropped from the callbacks (callbacks.progress_bar=null) is gone:
    # Lightning would otherwise add its own default one.
    shown = {
        "enable_progress_bar": any(isinstance(c, ProgressBar) for c in callbacks),
        "enable_model_summary": any(isinstance(c, ModelSummary) for c in callbacks),
    }
    if precision.reason:
        log.info(f"Precision: {precision.lightning} ({precision.reason})")
    trainer: L.Trainer = instantiate(
        "trainer",
        cfg.trainer,
        callbacks=[*callbacks, step_seen],
        logger=loggers or False,
        precision=precision.lightning,
        **shown,
    )
    _warn_if_more_processes_than_cores(trainer)
    job.watch(trainer)
    with no_files_left_if_failed_early(loggers, trainer, step_seen):
        metrics = _fit_and_test(cfg, datamodule, module, attack, trainer)
    if run_folder is not None and trainer.is_global_zero:
        write_finished(run_folder, metrics)  # last: a sweep run again skips this job (capsexp.run.sweep_resume)
        say_run_folder(run_folder, finished=True)
    return metrics


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


def _fit_and_test(
    cfg: DictConfig,
    datamodule: L.LightningDataModule,
    module: L.LightningModule,
    attack: AdversarialEvaluation | None,
    trainer: L.Trainer,
) -> dict[str, float]:
    hparams = OmegaConf.to_container(cfg, resolve=True)
    hparams[MODEL_PARAMETERS] = parameter_count(module)
    hparams[MODEL_FLOPS] = forward_flops_per_image(module, cfg.geometry.channels, cfg.geometry.image_size)
    module.flops_per_image = hparams[MODEL_FLOPS]  # the model summary shows them (capsexp.callbacks.model_summary)
    log.info(
        f"{type(getattr(module, 'net', module)).__name__}: {hparams[MODEL_PARAMETERS]:,} parameters, "
        f"{hparams[MODEL_FLOPS] / 1e6:,.1f} MFLOPs per image (forward)"
    )
    if HydraConfig.initialized():  # the choices Hydra made for this run lead the HParams tab
        overrides, choices = list(HydraConfig.get().overrides.task), dict(HydraConfig.get().runtime.choices)
    else:
        overrides, choices = [], {}
    chosen = run_choices(hparams, overrides, choices)
    log_hyperparameters(trainer.loggers, hparams, chosen)

    metrics: dict[str, float] = {}
    train_seconds, ckpt_path = None, None
    if cfg.get("train"):
        run_folder = _run_folder()
        if trainer.global_rank == 0 and run_folder is not None and _single_run():
            record = slurm.record_run_folder(cfg.paths.log_dir, cfg.task_name, run_folder)
            if record is not None:
                log.info(f"SLURM job {slurm.job_id()}: its restarts resume this run (recorded in {record})")
        log.info("Training")
        started = time.perf_counter()
        with lightning_settings_named():
            trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
        train_seconds = time.perf_counter() - started
        _raise_if_stopped_by_signal(trainer)
        metrics.update({name: float(value) for name, value in trainer.callback_metrics.items()})
        # A resumed run that did not validate after its resume still has its earlier parts' best (a sweep's
        # optimized_metric).
        best = getattr(module, "best_validation_accuracy", None)
        if VAL_ACC_BEST not in metrics and best is not None:
            metrics[VAL_ACC_BEST] = best

    if cfg.get("test"):
        if cfg.get("train"):
            ckpt_path = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
            if not ckpt_path:
                log.warning("No best checkpoint was saved (the run never validated): testing the current weights.")
        else:
            ckpt_path = cfg.get("ckpt_path")
            # Lightning restores the callbacks' states from the tested checkpoint and warns that its
            # checkpoint folder was another run's: this run writes none.
            warnings.filterwarnings("ignore", message=r"The dirpath has changed")
            if not ckpt_path:
                log.warning("test without train and without ckpt_path: testing untrained weights.")
        log.info(f"Testing {ckpt_path or 'the current weights'}")
        trainer.test(module, datamodule=datamodule, ckpt_path=ckpt_path or None)
        metrics.update({name: float(value) for name, value in trainer.callback_metrics.items()})
        if attack is not None:  # the module holds the tested weights
            from capsexp.run.attack import attack_tested_model  # foolbox: only when attacking

            metrics.update(attack_tested_model(cfg, attack, module, datamodule, trainer, _run_folder()))

    run_folder = _run_folder()
    if run_folder is not None and trainer.is_global_zero:
        facts = CardFacts(
            net=type(getattr(module, "net", module)).__name__,
            choices=chosen,
            config=hparams,
            parameters=hparams[MODEL_PARAMETERS],
            flops=hparams[MODEL_FLOPS],
            split_sizes=split_sizes(datamodule),
            class_names=getattr(datamodule, "class_names", []),
            metrics=metrics,
            train_seconds=train_seconds,
            machine=describe_machine(),
            revision=module.run_record.revision if module.run_record else None,
            checkpoint=str(shown_path(Path(ckpt_path))) if ckpt_path else None,
            run_folder=str(shown_path(run_folder)),
            overrides=overrides,
            tested_sha256=file_sha256(Path(ckpt_path)) if ckpt_path and not cfg.get("train") else None,
            precision=str(trainer.precision),
        )
        log.info(f"Model card: {shown_path(write_model_card(run_folder, facts))}")
    return metrics


def file_sha256(path: Path) -> str | None:
    """The SHA-256 of a file, read in chunks (None where it is not a file: an alias Lightning resolved)."""
    if not path.is_file():
        return None
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def split_sizes(datamodule: L.LightningDataModule) -> dict[str, int]:
    """Images (MultiMNIST: pairs) in each split the DataModule set up, each extra test set by its name."""
    sizes = {}
    for name in ("train", "val", "test"):
        dataset = getattr(datamodule, f"data_{name}", None)
        if dataset is not None:
            sizes[name] = len(dataset)
    names = list(getattr(datamodule, "test_set_names", []))[1:]
    for name, dataset in zip(names, getattr(datamodule, "extra_tests", ()), strict=False):
        sizes[f"test {name}"] = len(dataset)
    return sizes


def _raise_if_stopped_by_signal(trainer: L.Trainer) -> None:
    """:class:`Interrupted`, with the saved state's path and the command that resumes it, when a
    signal ended training (:class:`~capsexp.callbacks.model_checkpoint.BestAndLastCheckpoint`). On SLURM's
    requeue signal the job is requeued first (:mod:`capsexp.run.slurm`)."""
    stopped = next((cb for cb in trainer.checkpoint_callbacks if getattr(cb, "stopped_by", None)), None)
    if stopped is None:
        return
    if trainer.global_rank != 0:  # one line, from the first process
        sys.exit(128 + stopped.stopped_by)
    last = Path(stopped.last_model_path).resolve()
    run_folder = _run_folder()
    if run_folder is not None and last == run_folder / LAST_CHECKPOINT:
        resume = ["python", "-m", "capsexp", f"ckpt_path={shown_path(run_folder)}"]  # capsexp.run.resume
    else:  # a checkpoint outside the run folder: the run's overrides, then the file
        overrides = HydraConfig.get().overrides.task if run_folder is not None else []
        resume = ["python", "-m", "capsexp", *(o for o in overrides if not o.lstrip("+").startswith("ckpt_path="))]
        resume.append(f"ckpt_path={hydra_value(shown_path(last))}")
    next_step = f"resume with: {shlex.join(resume)}"
    if not _single_run():  # a sweep's job: the sweep's own command finishes it and the jobs after it
        next_step = "the sweep's command, run again, resumes it from there"
    job = slurm.job_id()
    if stopped.stopped_by == requeue_signal(trainer) and job is not None:
        if run_folder is None or not _single_run():
            next_step = f"SLURM job {job} not requeued (only a single run resumes in its folder); {next_step}"
        elif (status := slurm.requeue(job)) == 0:
            next_step = f"SLURM job {job} requeued: it resumes in {shown_path(run_folder)}"
        else:
            next_step = f"requeuing SLURM job {job} failed (scontrol requeue: exit status {status}); {next_step}"
    raise Interrupted(
        f"{stopped.stopped_by.name}: training stopped at step {trainer.global_step}, its state saved in "
        f"{shown_path(last)}; {next_step}",
        stopped.stopped_by,
    )


def _run_folder() -> Path | None:
    """This job's Hydra output folder (None outside Hydra)."""
    return Path(HydraConfig.get().runtime.output_dir).resolve() if HydraConfig.initialized() else None


def _single_run() -> bool:
    """True for ``python -m capsexp`` without ``-m`` (and outside Hydra)."""
    from hydra.types import RunMode

    return not HydraConfig.initialized() or HydraConfig.get().mode == RunMode.RUN
