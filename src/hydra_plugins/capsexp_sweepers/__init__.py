"""capsexp's Hydra sweepers. Hydra instantiates a sweeper only if its class is defined in the
``hydra_plugins`` namespace: each class here joins capsexp's behaviour to a Hydra sweeper."""

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

from capsexp.run.sweep_resume import SkipsFinishedJobs


class ResumableSweeper(SkipsFinishedJobs, BasicSweeper):
    """``hydra/sweeper=resumable``: Hydra's basic sweeper, finishing an earlier sweep of its folder
    (:mod:`capsexp.run.sweep_resume`)."""
