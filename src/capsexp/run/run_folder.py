"""The run's folder, said on the console, and what a run that failed before its first step leaves there.

A run that fails before any training or test step (missing data, a validation set larger than the
data, an image size the net cannot take) has logged nothing, yet its logger has already written an
event file: TensorBoard would list an empty run beside the real ones. :func:`no_files_left_if_failed_early`
removes what the loggers wrote in such a run; the folder keeps its config and log, for the record.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger

log = logging.getLogger(__name__)


def shown_path(path: Path) -> Path:
    """``path`` relative to the working directory when inside it (what a user can paste)."""
    with contextlib.suppress(ValueError):
        return path.relative_to(Path.cwd().resolve())
    return path


def say_run_folder(run_folder: Path, finished: bool) -> None:
    """One console line naming the run's folder: at the start, and at the end with the command that
    opens it in TensorBoard."""
    folder = shown_path(run_folder)
    if finished:
        log.info(f"Run folder: {folder} (TensorBoard: tensorboard --logdir {folder})")
    else:
        log.info(f"Run folder: {folder}")


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


LOGGER_FILES = ("hparams.yaml", "metrics.csv")


@contextlib.contextmanager
def no_files_left_if_failed_early(loggers: list[Logger], trainer: L.Trainer, step_seen: StepSeen) -> Iterator[None]:
    """On an error before ``step_seen`` saw a step, remove the files the loggers wrote in the block (a
    resumed run's earlier event files stay), and the loggers' folders if they are left empty."""
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
