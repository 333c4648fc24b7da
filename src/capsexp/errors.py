"""User-facing errors: the CLI prints their message alone, without a traceback.

Exit status of ``python -m capsexp``: 0 for a run that finished, 2 for a usage error (a value or
group on the command line that is not allowed: :class:`ConfigError`), 130 / 143 for training
stopped by SIGINT / SIGTERM with its state saved (:class:`Interrupted`; 138 for SLURM's requeue signal,
SIGUSR1), 1 for any other failure.
"""

import os
import sys


class CapsexpError(Exception):
    """An error whose message tells the user what to do; no traceback is needed."""

    exit_code = 1
    prefix = "error: "  # before the message on the command line


class ConfigError(CapsexpError, ValueError):
    """A config value (or a combination of values) that is not allowed."""

    exit_code = 2


class DatasetNotFoundError(CapsexpError):
    """Dataset files are missing and could not be downloaded."""


class CorruptDatasetError(CapsexpError):
    """A dataset file exists but is truncated, corrupted or in the wrong format."""


class DataFolderError(CapsexpError):
    """The data folder cannot be created, read or written."""


class CheckpointError(CapsexpError):
    """A checkpoint that is missing, empty, not a capsexp/Lightning checkpoint or of another model."""


class InputShapeError(CapsexpError, ValueError):
    """Images of another shape than the net was built for."""


class ImageError(CapsexpError):
    """An image to predict on that is missing or unreadable, or none at all."""


class Interrupted(CapsexpError):
    """Training stopped by a signal after saving its state; the message says where and how to resume.
    Exit status 128 + the signal's number, the shell's convention (130 for SIGINT, 143 for SIGTERM)."""

    prefix = ""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + int(signum)


class NoRunsError(CapsexpError):
    """The folder given to ``python -m capsexp.compare`` holds no run."""


def report(error: CapsexpError) -> None:
    """Print a user's error as its message alone and exit with its status (2: usage, 1: other): what the
    command lines do with a :class:`CapsexpError`. HYDRA_FULL_ERROR=1 shows the traceback instead, as for
    Hydra's own errors."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise error
    print(f"\n{error.prefix}{error}", file=sys.stderr)
    sys.exit(error.exit_code)
