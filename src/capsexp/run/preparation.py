"""What a run settles before it builds anything: the console, the seed, the precision, and the machine and
code it runs on, written into its folder."""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from capsexp.config.instantiation import quiet_lightning_notices
from capsexp.config.precision import Precision, routing_of
from capsexp.config.precision import resolve as resolve_precision
from capsexp.records.machine import write_machine
from capsexp.records.revision import at_import, of_this_process, write_revision
from capsexp.records.run_record import RunRecord
from capsexp.run.run_folder import run_folder, say_run_folder

log = logging.getLogger(__name__)
# The code this process runs, read as it imports it: each job it runs records this (of_this_process).
at_import()


@dataclass
class Prepared:
    """``folder``: the run's (None outside Hydra); ``precision``: Lightning's, and why where capsexp chose it;
    ``revision``: the code the run ran, with its earlier parts' where it goes on from a saved state."""

    folder: Path | None
    precision: Precision
    revision: dict[str, Any] | None


def prepare(cfg: DictConfig) -> Prepared:
    """Console, warnings, seed and float32 matmul precision set; the run's folder named on the console and
    its machine and revision written there (by the first process of a node)."""
    _quiet_duplicate_console()
    # Raised inside Lightning 2.6 by torch 2.14 on every run; nothing a user can act on.
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    folder, revision = run_folder(), of_this_process()
    model = HydraConfig.get().runtime.choices.get("model") if HydraConfig.initialized() else None
    precision = resolve_precision(
        cfg.trainer.get("precision"), model, routing_of(cfg.model), cfg.trainer.get("accelerator")
    )
    if folder is not None and int(os.environ.get("LOCAL_RANK", 0)) == 0:
        say_run_folder(folder, finished=False)
        write_machine(folder, precision.lightning)
        revision = write_revision(folder, revision)  # with the code of the run's earlier parts, if resumed
    if cfg.get("seed") is not None:
        L.seed_everything(cfg.seed, workers=True)
    if torch.cuda.is_available():
        torch.set_float32_matmul_precision(cfg.get("float32_matmul_precision") or "highest")
    if precision.reason:
        log.info(f"Precision: {precision.lightning} ({precision.reason})")
    return Prepared(folder, precision, revision)


def run_record(cfg: DictConfig, revision: dict[str, Any] | None) -> RunRecord:
    """What every checkpoint of the run carries: what rebuilds its model and preprocessing, and its code."""
    return RunRecord(
        config=OmegaConf.to_container(cfg, resolve=True),
        overrides=list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else [],
        revision=revision,
    )


def _quiet_duplicate_console() -> None:
    """``import lightning`` gives its logger a console handler of its own; when the root logger
    already prints (Hydra's, which also writes the run's log file), each line would show twice.
    Lightning's notices (:data:`~capsexp.config.instantiation.LIGHTNING_NOTICES`) are left out."""
    if logging.getLogger().hasHandlers():
        lightning_logger = logging.getLogger("lightning")
        for handler in list(lightning_logger.handlers):
            lightning_logger.removeHandler(handler)
    quiet_lightning_notices()
