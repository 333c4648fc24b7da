"""The comparison page of a multirun, written when its last job ends (a Hydra callback, set in
``conf/hydra/default.yaml``): ``python -m capsexp -m ...`` leaves ``README.md``, ``comparison.csv`` and
the plots in its sweep folder, as ``python -m capsexp.compare <that folder>`` would."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from capsexp.errors import CapsexpError

log = logging.getLogger("capsexp")


class WriteComparison(Callback):
    """Runs the experiment's ``after_sweep`` steps (callables built by ``hydra.utils.instantiate``, given
    the sweep's folder: a study's step that needs every run done, e.g. black-box attacks), then writes
    the page."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.utils import instantiate

        from capsexp.results.compare import PAGE, compare  # tensorboard and matplotlib: only now

        folder = Path(config.hydra.sweep.dir)
        logging.getLogger("tensorboard").setLevel(logging.WARNING)  # its event reader logs every file at INFO
        try:
            for step in config.get("after_sweep") or []:
                instantiate(step)(folder)
            result = compare(folder)
        except CapsexpError as error:  # e.g. every job failed before logging: the jobs said why
            log.warning(f"No comparison page: {error}")
            return
        log.info(f"Comparison of the runs: {result.output / PAGE}")
        if result.failed:
            log.warning(f"Outside the expected figures' tolerance: {'; '.join(result.failed)}")
