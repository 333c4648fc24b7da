"""The record of its run that every checkpoint carries, so that the file alone rebuilds its model, its
preprocessing and its test: the resolved config, the command-line overrides, the code's revision and the
class names. Plain values only: checkpoints load with ``torch.load(weights_only=True)``."""

from __future__ import annotations

import dataclasses
from typing import Any

from capsexp.locations import RUN_RECORD


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """``config``: the run's resolved config; ``overrides``: its command-line overrides (None in checkpoints
    written before they were recorded); ``revision``: the code (:mod:`capsexp.records.revision`);
    ``class_names``: the data's, where it names its classes."""

    config: dict[str, Any]
    overrides: list[str] | None = None
    revision: dict[str, Any] | None = None
    class_names: list[str] | None = None

    def saved_in(self, checkpoint: dict[str, Any]) -> None:
        """Write the record into a checkpoint (Lightning's ``on_save_checkpoint``)."""
        checkpoint[RUN_RECORD] = dataclasses.asdict(self)

    @classmethod
    def of(cls, checkpoint: dict[str, Any]) -> RunRecord | None:
        """The record a checkpoint carries; None for one written before runs recorded themselves in it."""
        saved = checkpoint.get(RUN_RECORD) if isinstance(checkpoint, dict) else None
        if not isinstance(saved, dict) or "config" not in saved:
            return None
        fields = {field.name for field in dataclasses.fields(cls)}
        return cls(**{name: value for name, value in saved.items() if name in fields})
