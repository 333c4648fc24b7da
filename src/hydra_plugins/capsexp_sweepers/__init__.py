"""capsexp's Hydra sweepers. Hydra instantiates a sweeper only if its class is defined in the
``hydra_plugins`` namespace: each class here joins capsexp's behaviour to a Hydra sweeper."""

import warnings
from dataclasses import dataclass
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper
from hydra_plugins.hydra_optuna_sweeper.config import OptunaSweeperConf

from capsexp.run.sweep_resume import SkipsFinishedJobs


class ResumableSweeper(SkipsFinishedJobs, BasicSweeper):
    """``hydra/sweeper=resumable``: Hydra's basic sweeper, finishing an earlier sweep of its folder
    (:mod:`capsexp.run.sweep_resume`)."""


class ResumableOptunaSweeper(Sweeper):
    """``hydra/sweeper=resumable_optuna``: the Optuna sweeper with its study in a database
    (:mod:`capsexp.run.optuna_search`, imported only when a search runs: Optuna is slow to import)."""

    def __init__(self, heartbeat_interval: int, grace_period: int, **options: Any) -> None:
        with warnings.catch_warnings():  # Optuna 2 on SQLAlchemy 1.4, at import: a notice for Optuna's authors
            warnings.filterwarnings("ignore", message=r"Deprecated API features detected")
            from capsexp.run.optuna_search import ResumableSearch

        self.search = ResumableSearch(**options, heartbeat_interval=heartbeat_interval, grace_period=grace_period)

    def setup(self, **kwargs: Any) -> None:
        self.search.setup(**kwargs)

    def sweep(self, arguments: list[str]) -> None:
        return self.search.sweep(arguments)


@dataclass
class ResumableOptunaSweeperConf(OptunaSweeperConf):
    _target_: str = "hydra_plugins.capsexp_sweepers.ResumableOptunaSweeper"
    # Seconds between a running trial's heartbeats, and the age of its last at which its worker counts
    # as dead (its trial then runs again).
    heartbeat_interval: int = 30
    grace_period: int = 120


ConfigStore.instance().store(group="hydra/sweeper", name="resumable_optuna", node=ResumableOptunaSweeperConf)
