"""``run(cfg)``, the training script: build everything from the composed config, train, test the best
checkpoint, write the model card. Each step's details are in the module it calls."""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from capsexp.config.instantiation import build_model, instantiate
from capsexp.locations import shown_path
from capsexp.overrides import hydra_value
from capsexp.records.checkpoints import check_checkpoint
from capsexp.records.model_card import write_model_card
from capsexp.run import stages
from capsexp.run.card import card_facts
from capsexp.run.distributed import DDPJob, ddp_job
from capsexp.run.preparation import prepare, run_record
from capsexp.run.run_folder import no_files_left_if_failed_early, say_run_folder
from capsexp.run.sweep_resume import write_finished
from capsexp.run.trainer import build_trainer

log = logging.getLogger(__name__)


def run(cfg: DictConfig) -> dict[str, float]:
    """Seed, instantiate data, model, callbacks, loggers and trainer; fit; test; return the metrics.

    With ``trainer.devices > 1`` every process runs this; the returned metrics are reduced over all
    of them (the same on every rank).
    """
    # The extra processes of a DDP job go on from the state the job goes on from (capsexp.run.sweep_resume).
    with ddp_job([f"ckpt_path={hydra_value(cfg.ckpt_path)}"] if cfg.get("ckpt_path") else []) as job:
        return train(cfg, job)


def train(cfg: DictConfig, job: DDPJob) -> dict[str, float]:
    prepared = prepare(cfg)
    # Plain containers for the data too: Lightning saves its arguments in checkpoints as well.
    datamodule = instantiate("data", cfg.data, _convert_="all")
    module = build_model("model", cfg.model)
    module.run_record = run_record(cfg, prepared.revision)
    if cfg.get("ckpt_path"):
        check_checkpoint(cfg.ckpt_path, module)
    # Built before training, so that a bad attack option fails now, not after hours of training.
    attack = instantiate("attack", cfg.attack) if cfg.get("attack") else None
    trainer = build_trainer(cfg, prepared)
    job.watch(trainer)
    with no_files_left_if_failed_early(trainer):
        facts = stages.log_model_and_hyperparameters(cfg, module, trainer)
        if cfg.get("train"):
            stages.fit(cfg, trainer, module, datamodule, facts)
        if cfg.get("test"):
            stages.test(cfg, trainer, module, datamodule, attack, facts)
    if prepared.folder is not None and trainer.is_global_zero:
        card = write_model_card(prepared.folder, card_facts(facts, module, datamodule, trainer, prepared.folder))
        log.info(f"Model card: {shown_path(card)}")
        write_finished(prepared.folder, facts.metrics)  # last: a sweep run again skips this job (run.sweep_resume)
        say_run_folder(prepared.folder, finished=True)
    return facts.metrics
