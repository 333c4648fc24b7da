"""The comparison page of a multirun, written when its last job ends (a Hydra callback, set in
``conf/hydra/default.yaml``): ``python -m capsexp -m ...`` leaves ``README.md``, ``comparison.csv`` and
the plots in its sweep folder, as ``python -m capsexp.compare <that folder>`` would."""

from __future__ import annotations

import logging
import traceback
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("capsexp")
AFTER_SWEEP_LOG = "after_sweep.log"  # in the sweep folder: the traceback of each step that failed
FAILED: list[str] = []  # the after-sweep steps of this process that failed: the command exits 1 (capsexp.__main__)


class WriteComparison(Callback):
    """Runs the experiment's ``after_sweep`` steps (callables built by ``hydra.utils.instantiate``, given
    the sweep's folder: a study's step that needs every run done, e.g. black-box attacks), then writes
    the page."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Each step, then the page. A step or a page that fails does not stop the others (the jobs'
        results stay, and the page is written over them where it can be); its traceback goes to the
        sweep folder's ``after_sweep.log``, a line names it, and the command exits 1 (Hydra itself would
        turn the error into a warning and exit 0)."""
        from hydra.utils import instantiate

        from capsexp.errors import NoRunsError
        from capsexp.results.compare import PAGE, compare  # tensorboard and matplotlib: only now

        folder = Path(config.hydra.sweep.dir)
        logging.getLogger("tensorboard").setLevel(logging.WARNING)  # its event reader logs every file at INFO
        for step in config.get("after_sweep") or []:
            try:
                instantiate(step)(folder)
            except Exception as error:
                self._failed(f"after-sweep step {step.get('_target_', step)}", error, folder)
        try:
            result = compare(folder)
        except NoRunsError as error:  # every job failed before logging: the jobs said why
            log.warning(f"No comparison page: {error}")
            return
        except Exception as error:
            self._failed("the comparison page", error, folder)
            return
        log.info(f"Comparison of the runs: {result.output / PAGE}")
        if result.failed:
            log.warning(f"Outside the expected figures' tolerance: {'; '.join(result.failed)}")

    @staticmethod
    def _failed(what: str, error: Exception, folder: Path) -> None:
        record = folder / AFTER_SWEEP_LOG
        with open(record, "a") as handle:
            handle.write(f"{what} failed:\n{''.join(traceback.format_exception(error))}\n")
        log.error(
            f"{what} failed ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); "
            f"the traceback is in {record}"
        )
        FAILED.append(what)
