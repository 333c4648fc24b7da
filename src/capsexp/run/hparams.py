"""The run's hyperparameters for every logger, and TensorBoard's HParams tab.

The HParams tab lists a run when its event files hold a session summary that names the
hyperparameters and the metric tags; it then reads each metric's last value from the run's scalars.
Lightning's ``TensorBoardLogger.log_hyperparams`` writes that summary only together with initial
values for the metrics (a 0 or -1 at step 0 of every curve), so the summary is written here, with
the tags alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from lightning.pytorch.loggers import Logger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.tensorboard.summary import hparams as hparams_summary

from capsexp.locations import is_location  # left out too: event files carry no machine's paths
from capsexp.overrides import key as override_key
from capsexp.overrides import written
from capsexp.records.metric_names import (
    MODEL_PARAMETERS,
    PLAIN,
    PRESENCE_GAP,
    TRAIN_IMAGES_PER_S,
    VAL_ACC,
    VAL_ACC_BEST,
    VAL_LOSS,
    metrics_of_test_sets,
)

# Config groups that say where things go or what is logged, not what was run, and a study's budgets,
# page and steps after its sweep (the chosen budget's values are in the keys it sets): their
# command-line overrides are left out of the HParams tab.
NOT_HYPERPARAMETERS = ("paths", "logger", "hydra", "budgets", "page", "after_sweep", "callbacks")


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, int | float | str | bool]:
    """``{"model": {"net": {"routing": {"iterations": 3}}}}`` → ``{"model/net/routing/iterations": 3}``;
    values TensorBoard cannot show (lists, None) become their text."""
    flat: dict[str, int | float | str | bool] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, prefix=f"{name}/"))
        elif isinstance(value, (int, float, str, bool)):
            flat[name] = value
        else:
            flat[name] = str(value)
    return flat


def metric_names(test_set_names: Iterable[str] = (PLAIN,), presence: bool = False) -> list[str]:
    """The metrics the HParams tab shows, in its column order: the best validation accuracy, the test
    metrics of the DataModule's test sets (:func:`capsexp.records.metric_names.metrics_of_test_sets`),
    the presence gap where the objective logs it (``presence``), training images/s, then the last
    validation accuracy and loss."""
    gap = [PRESENCE_GAP] if presence else []
    return [VAL_ACC_BEST, *metrics_of_test_sets(test_set_names), *gap, TRAIN_IMAGES_PER_S, VAL_ACC, VAL_LOSS]


# Config groups whose choice the HParams tab shows, with the seed (model/routing: capsule models only).
LEADING_GROUPS = ("model", "data", "model/routing")
LEADING_COLUMNS = (*LEADING_GROUPS, "seed", MODEL_PARAMETERS)  # the HParams tab's first columns, in order


def run_choices(
    config: Mapping[str, Any], overrides: Iterable[str], group_choices: Mapping[str, str | None]
) -> dict[str, int | float | str | bool]:
    """The HParams tab's columns: the model and data configs chosen, the seed, the parameter count, then
    each command-line override (``overrides``, as Hydra records them) that is not already there and
    neither locates files nor sets what is logged, named by its key as the flattened config names it
    (``model.optimizer.lr`` → ``model/optimizer/lr``), with the value it took."""
    flat = flatten(config)
    choices: dict[str, int | float | str | bool] = {
        group: choice for group in LEADING_GROUPS if isinstance(choice := group_choices.get(group), str)
    }
    for key in LEADING_COLUMNS[len(LEADING_GROUPS) :]:
        if key in flat:
            choices[key] = flat[key]
    for override in overrides:
        name, value = override_key(override).replace(".", "/"), written(override) or ""
        if name in choices or is_location(name) or name.split("/")[0] in NOT_HYPERPARAMETERS:
            continue
        choices[name] = flat.get(name, value)
    return choices


@rank_zero_only
def log_hyperparameters(
    loggers: Iterable[Logger], config: Mapping[str, Any], choices: Mapping[str, int | float | str | bool]
) -> None:
    """Give every logger the whole config (TensorBoard's ``hparams.yaml`` beside the event files,
    CSV's ...); write the HParams session into each TensorBoard run with ``choices`` (:func:`run_choices`)
    as its hyperparameters. The tab holds the choices alone: it sorts hyperparameters by name and shows
    only the first few, so with the whole config it showed callbacks' settings and hid what the runs
    differ by. Its columns and metrics: :mod:`capsexp.tensorboard`, over every run served."""
    for logger in loggers:
        logger.log_hyperparams(dict(config))
        if isinstance(logger, TensorBoardLogger):
            # The session's start and end, not the experiment summary (the tab's columns): TensorBoard
            # takes the columns of one run's experiment summary for every run, so choices made by other
            # runs only never showed. Without one it takes every run's choices and every scalar tag;
            # `python -m capsexp.tensorboard` serves one of every run's choices and the metrics named.
            _, session_start, session_end = hparams_summary(dict(choices), {})
            writer = logger.experiment._get_file_writer()
            for summary in (session_start, session_end):
                writer.add_summary(summary)
            writer.flush()
