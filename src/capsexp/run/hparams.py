"""The run's hyperparameters for every logger, and TensorBoard's HParams tab.

The HParams tab lists a run when its event files hold a session summary that names the
hyperparameters and the metric tags; it then reads each metric's last value from the run's scalars.
Lightning's ``TensorBoardLogger.log_hyperparams`` writes that summary only together with initial
values for the metrics (a 0 or -1 at step 0 of every curve), so the summary is written here, with
the tags alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from lightning.pytorch.loggers import Logger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.tensorboard.summary import hparams as hparams_summary

from capsexp.results.metric_names import PLAIN, VAL_ACC, VAL_ACC_BEST, VAL_LOSS, metrics_of_test_sets

# Config groups that say where things go, not what was run, and a study's budgets, page and steps
# after its sweep (the chosen budget's values are in the keys it sets): left out of the HParams tab.
NOT_HYPERPARAMETERS = ("paths", "logger", "hydra", "budgets", "page", "after_sweep")
# Keys elsewhere that only locate files (data/data_dir, trainer/default_root_dir, a checkpoint
# callback's dirpath, ckpt_path): left out too, so that event files carry no machine's paths.
LOCATION_KEY = re.compile(r"(^|/|_)(dir|dirpath|path)$")


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


def metric_names(test_set_names: Iterable[str] = (PLAIN,)) -> list[str]:
    """The metrics the HParams tab shows: validation accuracy and loss, and the test metrics of the
    DataModule's test sets (:func:`capsexp.results.metric_names.metrics_of_test_sets`)."""
    return [VAL_ACC_BEST, VAL_ACC, VAL_LOSS, *metrics_of_test_sets(test_set_names)]


@rank_zero_only
def log_hyperparameters(loggers: Iterable[Logger], config: Mapping[str, Any], metrics: Iterable[str]) -> None:
    """Give every logger the whole config (TensorBoard's ``hparams.yaml``, CSV's ...); write the
    HParams session summary into each TensorBoard run, naming ``metrics``."""
    flat = flatten({k: v for k, v in config.items() if k not in NOT_HYPERPARAMETERS})
    tensorboard_params = {k: v for k, v in flat.items() if not LOCATION_KEY.search(k)}
    for logger in loggers:
        logger.log_hyperparams(dict(config))
        if isinstance(logger, TensorBoardLogger):
            # The values in the metric dict are not written; only its keys name the columns.
            summaries = hparams_summary(tensorboard_params, {name: 0.0 for name in metrics})
            writer = logger.experiment._get_file_writer()
            for summary in summaries:
                writer.add_summary(summary)
            writer.flush()
