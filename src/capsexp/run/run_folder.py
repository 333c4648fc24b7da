"""The run's folder, said on the console, and what a run that failed before its first step leaves there.

A run that fails before any training or test step (missing data, a validation set larger than the
data, an image size the net cannot take) has logged nothing, yet its logger has already written an
event file: TensorBoard would list an empty run beside the real ones. :func:`no_files_left_if_failed_early`
removes what the loggers wrote in such a run; the folder keeps its config and log, for the record.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from capsexp.locations import LAST_CHECKPOINT, shown_path
from capsexp.records.checkpoints import peek
from capsexp.records.events import event_files

log = logging.getLogger(__name__)


def run_folder() -> Path | None:
    """This job's Hydra output folder (None outside Hydra)."""
    return Path(HydraConfig.get().runtime.output_dir).resolve() if HydraConfig.initialized() else None


def single_run() -> bool:
    """True for ``python -m capsexp`` without ``-m`` (and outside Hydra)."""
    from hydra.types import RunMode

    return not HydraConfig.initialized() or HydraConfig.get().mode == RunMode.RUN


def say_run_folder(run_folder: Path, finished: bool) -> None:
    """One console line naming the run's folder: at the start, and at the end with the command that
    opens it in TensorBoard, named by what it ran (``tensorboard --logdir <run>`` would name it ".")."""
    folder = shown_path(run_folder)
    if finished:
        command = shlex.join(["python", "-m", "capsexp.tensorboard", str(folder)])
        log.info(f"Run folder: {folder} (TensorBoard: {command})")
    else:
        log.info(f"Run folder: {folder}")


def steps_to_hide(run_folder: Path, ckpt_path: str | None) -> int | None:
    """The first step from which a run in ``run_folder`` logs again what the folder's event files or CSV
    metrics already hold, to be hidden in them (``SummaryWriter(purge_step=...)``: TensorBoard, and the
    pages reading through it, drop the earlier files' events from that step on; the CSV logger drops those
    rows: :mod:`capsexp.run.csv_logger`). A run going on from the folder's own ``last.ckpt``: the step of
    that state (a killed run logged past it). Any other run in a folder that holds them (a sweep's job
    started again): 0. None where the folder holds neither.
    Lightning logs batch ``k`` of training at step ``k`` (counting optimizer steps, one a batch), and a
    validation after it at step ``k`` too; a state saved after ``n`` steps (its ``global_step``) keeps the
    steps below ``n``, and the run going on from it logs from step ``n``."""

    if not event_files(run_folder) and not any(run_folder.rglob(ExperimentWriter.NAME_METRICS_FILE)):
        return None
    if not ckpt_path or Path(ckpt_path).resolve() != (run_folder / LAST_CHECKPOINT).resolve():
        return 0
    state = peek(ckpt_path)
    return int(state["global_step"]) if state is not None else 0


class StepSeen(Callback):
    """Whether this process ran a training or a test step (a sanity-check validation does not count)."""

    def __init__(self) -> None:
        self.seen = False

    def on_train_batch_end(self, *args: Any) -> None:
        self.seen = True

    def on_test_batch_end(self, *args: Any) -> None:
        self.seen = True


def _logger_folders(loggers: Iterable[Logger]) -> list[Path]:
    return [Path(logger.log_dir) for logger in loggers if getattr(logger, "log_dir", None)]


def _files(folders: Iterable[Path]) -> set[Path]:
    """The loggers' files in ``folders`` (which may be the run's own folder): event files, hparams.yaml
    and the CSV logger's metrics.csv."""
    return {
        path
        for folder in folders
        if folder.is_dir()
        for path in folder.rglob("*")
        if path.is_file() and (path.name.startswith("events.out.tfevents.") or path.name in LOGGER_FILES)
    }


LOGGER_FILES = ("hparams.yaml", ExperimentWriter.NAME_METRICS_FILE)


@contextlib.contextmanager
def no_files_left_if_failed_early(trainer: L.Trainer) -> Iterator[None]:
    """On an error before the trainer's :class:`StepSeen` saw a step, remove the files its loggers wrote in
    the block (a resumed run's earlier event files stay), and the loggers' folders if they are left empty."""
    loggers = trainer.loggers
    step_seen = next(callback for callback in trainer.callbacks if isinstance(callback, StepSeen))
    folders = _logger_folders(loggers)
    existing = _files(folders)
    try:
        yield
    except BaseException:
        if not step_seen.seen:
            for logger in loggers:  # close the event files before they are removed
                with contextlib.suppress(Exception):
                    logger.finalize("failed")
            new = _files(folders) - existing
            for path in new:
                path.unlink(missing_ok=True)
            for folder in folders:  # a logger's own folder, left empty (never the run's, which holds .hydra/)
                if folder.is_dir() and not any(path.is_file() for path in folder.rglob("*")):
                    shutil.rmtree(folder, ignore_errors=True)
            if new and trainer.is_global_zero:
                where = ", ".join(str(shown_path(folder.resolve())) for folder in folders)
                log.warning(
                    f"The run failed before its first step: its logger files were removed ({where}), so that "
                    "TensorBoard lists no empty run; its config and log are kept."
                )
        raise
