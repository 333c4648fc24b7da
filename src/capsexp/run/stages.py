"""The stages of a run, each a few lines of the training script: the model's cost and the run's
hyperparameters logged, training, and the test of the best checkpoint (with an attack, where configured).
What they gather is one :class:`RunFacts`, the model card's source."""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from capsexp.records.metric_names import LEARNED_OVER_CHANCE, MODEL_FLOPS, MODEL_PARAMETERS, VAL_ACC_BEST, learned
from capsexp.run import slurm
from capsexp.run.hparams import log_hyperparameters, run_choices
from capsexp.run.interruption import raise_if_stopped_by_signal
from capsexp.run.lightning_errors import lightning_settings_named
from capsexp.run.model_cost import forward_flops_per_image, parameter_count
from capsexp.run.run_folder import run_folder, single_run

if TYPE_CHECKING:
    from capsexp.attacks.evaluation import AdversarialEvaluation

log = logging.getLogger(__name__)


@dataclass
class RunFacts:
    """``hparams``: the resolved config with the model's cost; ``chosen``: the HParams tab's columns;
    ``overrides``: the command line's; ``metrics``: what training and the test logged last;
    ``train_seconds``: None without training; ``tested``: the checkpoint tested (None: the current weights)."""

    hparams: dict[str, Any]
    chosen: dict[str, Any]
    overrides: list[str]
    metrics: dict[str, float] = field(default_factory=dict)
    train_seconds: float | None = None
    tested: str | None = None


def log_model_and_hyperparameters(cfg: DictConfig, module: L.LightningModule, trainer: L.Trainer) -> RunFacts:
    """The model's parameters and forward FLOPs said on the console, and with the config given to every
    logger (the HParams tab: :func:`~capsexp.run.hparams.run_choices`)."""
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
    return RunFacts(hparams, chosen, overrides)


def fit(cfg: DictConfig, trainer: L.Trainer, module: L.LightningModule, datamodule: Any, run: RunFacts) -> None:
    """Train (from ``ckpt_path``'s state, where given); :class:`~capsexp.errors.Interrupted` when a signal
    stopped it."""
    folder = run_folder()
    if trainer.global_rank == 0 and folder is not None and single_run():
        record = slurm.record_run_folder(cfg.paths.log_dir, cfg.task_name, folder)
        if record is not None:
            log.info(f"SLURM job {slurm.job_id()}: its restarts resume this run (recorded in {record})")
    log.info("Training")
    started = time.perf_counter()
    with lightning_settings_named():
        trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    run.train_seconds = time.perf_counter() - started
    raise_if_stopped_by_signal(trainer)
    run.metrics.update({name: float(value) for name, value in trainer.callback_metrics.items()})
    # A resumed run that did not validate after its resume still has its earlier parts' best (a sweep's
    # optimized_metric).
    best = getattr(module, "best_validation_accuracy", None)
    if VAL_ACC_BEST not in run.metrics and best is not None:
        run.metrics[VAL_ACC_BEST] = best
    warn_if_not_learned(cfg, run.metrics)


def warn_if_not_learned(cfg: DictConfig, metrics: dict[str, float]) -> None:
    """A fit whose best validation accuracy is at chance said as such: nothing fails, and a page of such
    runs would otherwise compare nets that did not train."""
    classes = OmegaConf.select(cfg, "geometry.num_classes")
    best = metrics.get(VAL_ACC_BEST)
    if best is None or not isinstance(classes, int) or learned(best, classes):
        return
    log.warning(
        f"{VAL_ACC_BEST} {100 * best:.1f}% is not above {LEARNED_OVER_CHANCE:g} times chance ({100 / classes:.0f}% "
        f"for {classes} classes): this net did not learn. Its learning rate, its routing's options "
        "(model.net.routing) or too few steps are the usual causes."
    )


def test(
    cfg: DictConfig,
    trainer: L.Trainer,
    module: L.LightningModule,
    datamodule: Any,
    attack: AdversarialEvaluation | None,
    run: RunFacts,
) -> None:
    """Test the best checkpoint of this training (without training: ``ckpt_path``'s), then attack it."""
    if cfg.get("train"):
        tested = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        if not tested:
            log.warning("No best checkpoint was saved (the run never validated): testing the current weights.")
    else:
        tested = cfg.get("ckpt_path")
        # Lightning restores the callbacks' states from the tested checkpoint and warns that its
        # checkpoint folder was another run's: this run writes none.
        warnings.filterwarnings("ignore", message=r"The dirpath has changed")
        if not tested:
            log.warning("test without train and without ckpt_path: testing untrained weights.")
    run.tested = tested or None
    log.info(f"Testing {tested or 'the current weights'}")
    trainer.test(module, datamodule=datamodule, ckpt_path=tested or None)
    run.metrics.update({name: float(value) for name, value in trainer.callback_metrics.items()})
    if attack is not None:  # the module holds the tested weights
        from capsexp.run.attack import attack_tested_model  # foolbox: only when attacking

        run.metrics.update(attack_tested_model(cfg, attack, module, datamodule, trainer, run_folder()))
