"""Lightning's model summary, printed when training starts rather than when ``fit`` does: Lightning checks
its settings against the data (a validation interval beyond the epoch's batches) between the two, so a
mistake there is answered in a few lines, not after a table of every layer.

Its FLOPs are capsexp's count, the run's first log lines' (``model/flops_per_image``): Lightning counts
FLOPs only on a module's ``example_input_array``, which capsexp's modules do not have, and would print a
column of zeros and "Total FLOPs: 0"."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import RichModelSummary
from lightning.pytorch.utilities.model_summary import get_formatted_model_size, get_human_readable_count

_RIGHT_ALIGNED = ("Params", "Params per Device", "In sizes", "Out sizes")


class ModelSummaryAtTrainStart(RichModelSummary):
    """:class:`~lightning.pytorch.callbacks.RichModelSummary`, shown at ``on_train_start``, without
    Lightning's FLOPs: the module's ``flops_per_image`` (forward, one image) where the run counted them."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pass  # shown once the data has been checked: on_train_start

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._max_depth:
            return
        summary = self._summary(trainer, pl_module)
        columns = [(name, values) for name, values in summary._get_summary_data() if name != "FLOPs"]
        totals = {
            "Trainable params": get_human_readable_count(summary.trainable_parameters),
            "Non-trainable params": get_human_readable_count(summary.total_parameters - summary.trainable_parameters),
            "Total params": get_human_readable_count(summary.total_parameters),
            "Total estimated model params size (MB)": get_formatted_model_size(summary.model_size),
            "Modules in train mode": str(summary.total_training_modes["train"]),
            "Modules in eval mode": str(summary.total_training_modes["eval"]),
        }
        flops = getattr(pl_module, "flops_per_image", None)
        if flops is not None:
            totals["Forward FLOPs per image"] = f"{flops:,} (matrix products and convolutions)"
        if trainer.is_global_zero:
            _print(columns, totals, self._summarize_kwargs.get("header_style", "bold magenta"))


def _print(columns: list[tuple[str, list[str]]], totals: dict[str, str], header_style: str) -> None:
    """The table of layers, as Rich's summary draws it, and the totals below it."""
    from rich import get_console
    from rich.table import Table

    table = Table(header_style=header_style)
    for name, _ in columns:
        table.add_column(
            name,
            justify="right" if name in _RIGHT_ALIGNED else "left",
            no_wrap=name == "Name",
            style="dim" * (name == " "),
        )
    for row in zip(*(values for _, values in columns), strict=True):
        table.add_row(*row)
    grid = Table.grid(expand=True)
    grid.add_column()
    for name, value in totals.items():
        grid.add_row(f"[bold]{name}[/]: {value}")
    console = get_console()
    console.print(table)
    console.print(grid)
