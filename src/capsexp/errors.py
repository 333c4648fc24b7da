"""User-facing errors: the CLI prints their message alone, without a traceback.

Exit status of ``python -m capsexp``: 0 for a run that finished, 2 for a usage error (a value or
group on the command line that is not allowed: :class:`ConfigError`), 1 for any other failure.
"""


class CapsexpError(Exception):
    """An error whose message tells the user what to do; no traceback is needed."""

    exit_code = 1


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
