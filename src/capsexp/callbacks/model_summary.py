"""Lightning's model summary, printed when training starts rather than when ``fit`` does: Lightning checks
its settings against the data (a validation interval beyond the epoch's batches) between the two, so a
mistake there is answered in a few lines, not after a table of every layer."""

from __future__ import annotations

from lightning.pytorch.callbacks import RichModelSummary


class ModelSummaryAtTrainStart(RichModelSummary):
    """:class:`~lightning.pytorch.callbacks.RichModelSummary`, shown at ``on_train_start``."""

    def on_fit_start(self, trainer, pl_module) -> None:
        pass  # shown once the data has been checked: on_train_start

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_fit_start(trainer, pl_module)
