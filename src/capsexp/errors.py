"""User-facing errors: the CLI prints their message alone, without a traceback."""


class CapsexpError(Exception):
    """An error whose message tells the user what to do; no traceback is needed."""


class DatasetNotFoundError(CapsexpError):
    """Dataset files are missing and could not be downloaded."""


class CorruptDatasetError(CapsexpError):
    """A dataset file exists but is truncated, corrupted or in the wrong format."""
