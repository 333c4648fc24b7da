"""Lightning's CSV logger, made to go on in a folder that already holds its ``metrics.csv``.

Lightning's writer deletes an existing ``metrics.csv`` when it starts: a run resumed in its own folder
would keep only the rows logged after the resume. This one keeps the rows of the steps below
``purge_step`` and drops the rest (the steps a killed run logged past its saved state, which the
resumed run logs again), as ``SummaryWriter(purge_step=...)`` hides them in TensorBoard's event files.
"""

from __future__ import annotations

import csv
import os
import warnings
from typing import Any

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter


class ResumableCSVLogger(CSVLogger):
    """:class:`lightning.pytorch.loggers.CSVLogger` with ``purge_step``: where its folder holds a
    ``metrics.csv``, the rows of steps from ``purge_step`` on are dropped and the earlier ones kept
    (``purge_step=0``: none kept); None (the default) does as Lightning does (none kept either: its
    writer starts a new file)."""

    def __init__(self, *args: Any, purge_step: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.purge_step = purge_step

    @property
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            path = os.path.join(self.log_dir, ExperimentWriter.NAME_METRICS_FILE)
            kept, columns = _rows_before(path, self.purge_step)
            with warnings.catch_warnings():  # its warning that the earlier rows will be deleted: not so here
                if self.purge_step is not None:
                    warnings.filterwarnings("ignore", message="Experiment logs directory .* exists and is not empty")
                writer = super().experiment  # Lightning's writer removes the file here
            if writer is self._experiment and kept:  # rank zero's (the others get a stand-in)
                with open(path, "w", newline="") as handle:
                    table = csv.DictWriter(handle, fieldnames=columns)
                    table.writeheader()
                    table.writerows(kept)
                # Its next save appends under this header (and rewrites the file if new columns come).
                writer.metrics_keys = list(columns)
        return super().experiment


def _rows_before(path: str, step: int | None) -> tuple[list[dict[str, str]], list[str]]:
    """The rows of ``path`` whose step is below ``step``, and its columns (none where ``step`` is None
    or the file does not exist)."""
    if step is None or not os.path.isfile(path):
        return [], []
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
        columns = list(reader.fieldnames or [])
    return [row for row in rows if row.get("step") not in (None, "") and float(row["step"]) < step], columns
