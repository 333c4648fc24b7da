"""Optuna searches that outlive their machine and span several: the study lives in a database.

``hparams_search=<name>`` keeps its Optuna study in a SQLite file in the sweep folder (``optuna.db``)
unless ``hydra.sweeper.storage`` names another database (``postgresql://user@host/db`` for workers on
several machines). Every worker, and every run of the command again, works on that one study until it
holds ``n_trials`` trials:

- before each batch a worker counts the study's trials that are finished (complete, pruned, failed by
  their job) or running, and asks only for the rest (at most ``n_jobs`` at a time); when none are left
  but others still run, it waits for them, so that the search ends with every trial told;
- a worker records a heartbeat for each trial it runs (every ``heartbeat_interval`` seconds; Optuna's
  RDB storage). A running trial whose heartbeat is older than ``grace_period`` belongs to a worker that
  died: Optuna fails it and queues its parameters again (``RetryFailedTrialCallback``), and the next
  worker to ask runs it, in the dead trial's job folder, where it goes on from its ``last.ckpt``
  (:mod:`capsexp.run.sweep_resume`);
- a trial's job folder is named by its trial number, unique in the study, so that workers sharing a
  sweep folder never write into one another's jobs.

Built on the Hydra Optuna sweeper's implementation (its search space, trial configuration and results
file); the loop is this module's. The plugin pins Optuna below 3, whose RDB storage needs SQLAlchemy
below 2 (pinned in ``pyproject.toml``).
"""

from __future__ import annotations

import functools
import logging
import math
import shlex
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
from hydra.core.utils import JobReturn
from hydra_plugins.hydra_optuna_sweeper._impl import OptunaSweeperImpl, create_params_from_overrides
from omegaconf import OmegaConf
from optuna.storages import RDBStorage, RetryFailedTrialCallback
from optuna.trial import TrialState

from capsexp.errors import CapsexpError
from capsexp.run.sweep_resume import last_line_if_stopped

log = logging.getLogger("capsexp")

COUNTED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)  # toward n_trials, with JOB_FAILED ones
JOB_FAILED = "capsexp:job_failed"  # a trial's system attribute: its job failed (not its worker)


class ResumableSearch(OptunaSweeperImpl):
    """The Optuna sweeper's implementation with the study in storage and the loop above."""

    def __init__(self, *args: Any, heartbeat_interval: int, grace_period: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if heartbeat_interval < 1 or grace_period <= heartbeat_interval:
            raise CapsexpError(
                f"hydra.sweeper.heartbeat_interval={heartbeat_interval}, grace_period={grace_period}: the interval "
                "must be at least 1 s and the grace period longer than it"
            )
        self.heartbeat_interval, self.grace_period = heartbeat_interval, grace_period

    def sweep(self, arguments: list[str]) -> None:
        assert self.config is not None and self.launcher is not None
        # Optuna 2 (the sweeper plugin's pin) warns at each call of its heartbeat functions that they are
        # experimental: a notice for Optuna's authors, not for a search's user.
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        self._process_searchspace_config()
        distributions, fixed = create_params_from_overrides([*self._parse_sweeper_params_config(), *arguments])
        distributions = {**(self.search_space_distributions or {}), **distributions}
        for name in fixed:
            distributions.pop(name, None)
        if isinstance(self.sampler, functools.partial) and self.sampler.func == optuna.samplers.GridSampler:
            grid = {name: self._to_grid_sampler_choices(d) for name, d in distributions.items()}
            self.sampler = self.sampler(grid)
            self.n_trials = min(self.n_trials, math.prod(len(choices) for choices in grid.values()))
        study = self._study()
        directions = self._get_directions()
        while True:
            optuna.storages.fail_stale_trials(study)  # a dead worker's trials: failed, their parameters queued
            to_go = self.n_trials - _counted(study)
            if to_go <= 0:
                if not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                    break
                time.sleep(self.heartbeat_interval)  # others' trials still run: wait for them to be told
                continue
            trials = [study.ask() for _ in range(min(to_go, self.n_jobs))]
            with _Heartbeats(study, trials, self.heartbeat_interval):
                overrides = self._configure_trials(trials, distributions, fixed)
                returns = self._launch(trials, overrides)
            failures = [_tell(study, t, result, len(directions)) for t, result in zip(trials, returns, strict=True)]
            failed = [error for error in failures if error is not None]
            if failed and len(failed) / len(returns) > self.max_failure_rate:
                log.error(f"{len(failed)} of {len(returns)} trials failed, max_failure_rate={self.max_failure_rate}")
                for result in returns:
                    _ = result.return_value  # raises the job's own error, with its traceback
        self._write_results(study, directions)

    def _study(self) -> optuna.Study:
        """The study in its storage (created, or loaded with its trials), said in a line with the command
        that adds a worker."""
        url = str(self.storage)
        if url.startswith("sqlite:///"):  # SQLite creates its file, not the folders above it
            Path(url.removeprefix("sqlite:///")).expanduser().parent.mkdir(parents=True, exist_ok=True)
        storage = _storage(url, self.heartbeat_interval, self.grace_period)
        study = optuna.create_study(
            study_name=self.study_name,
            storage=storage,
            sampler=self.sampler,
            directions=self._get_directions(),
            load_if_exists=True,
        )
        done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))
        running = len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
        log.info(
            f"Optuna study {study.study_name} in {url}: {done} trials finished, {running} running "
            f"(another worker's, or a stopped one's: run again once its heartbeat is {self.grace_period} s old), "
            f"n_trials={self.n_trials}"
        )
        from sqlalchemy.engine import make_url

        from capsexp.overrides import hydra_value

        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        arguments = [a for a in sys.argv[1:] if not a.startswith(("hydra.sweep.dir=", "hydra.sweeper.storage="))]
        arguments += [f"hydra.sweep.dir={hydra_value(sweep_dir)}", f"hydra.sweeper.storage={hydra_value(url)}"]
        shown = shlex.join(["python", "-m", "capsexp", *arguments]).replace(url, make_url(url).__repr__())
        log.info(f"To finish this search if it is stopped, or add a worker to it: {shown}")
        self.finishing_command = shown
        return study

    def _launch(self, trials: list[optuna.Trial], overrides: Sequence[Sequence[str]]) -> list[JobReturn]:
        """Each trial as the job numbered by its trial (a retried trial: the one it retries, whose folder
        holds its saved state); consecutive numbers in one launch, so that a parallel launcher runs them
        together."""
        finishing = (
            f"The search stopped; this finishes it (the stopped trial retried from its saved state once its "
            f"heartbeat is {self.grace_period} s old): "
        )
        with last_line_if_stopped(lambda: finishing + self.finishing_command):
            return self._launch_numbered(trials, overrides)

    def _launch_numbered(self, trials: list[optuna.Trial], overrides: Sequence[Sequence[str]]) -> list[JobReturn]:
        retried = [RetryFailedTrialCallback.retried_trial_number(study_trial(t)) for t in trials]
        numbers = [t.number if number is None else number for t, number in zip(trials, retried, strict=True)]
        returns: list[JobReturn] = []
        start = 0
        while start < len(trials):
            end = start + 1
            while end < len(trials) and numbers[end] == numbers[end - 1] + 1:
                end += 1
            returns += self.launcher.launch(overrides[start:end], initial_job_idx=numbers[start])
            start = end
        return returns

    def _write_results(self, study: optuna.Study, directions: list[str]) -> None:
        assert self.config is not None
        if len(directions) < 2:
            best = study.best_trial
            results: dict[str, Any] = {"name": "optuna", "best_params": best.params, "best_value": best.value}
            log.info(f"Best parameters: {best.params}; best value: {best.value}")
        else:
            solutions = [{"params": t.params, "values": t.values} for t in study.best_trials]
            results = {"name": "optuna", "solutions": solutions}
        Path(self.config.hydra.sweep.dir).mkdir(parents=True, exist_ok=True)
        OmegaConf.save(OmegaConf.create(results), Path(self.config.hydra.sweep.dir) / "optimization_results.yaml")


def _storage(url: str, heartbeat_interval: int, grace_period: int, attempts: int = 10) -> RDBStorage:
    """Optuna's storage of ``url``. Workers started together on a new database each create its tables and
    stamp its schema version; all but one fail doing so (a unique constraint, a locked SQLite file) and
    try again, finding it made."""
    from sqlalchemy.exc import IntegrityError, OperationalError

    for attempt in range(attempts):
        try:
            return RDBStorage(
                url,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
                failed_trial_callback=RetryFailedTrialCallback(),
            )
        except (IntegrityError, OperationalError):
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def study_trial(trial: optuna.Trial) -> optuna.trial.FrozenTrial:
    """The stored state of an asked trial (its system attributes: which trial it retries)."""
    return trial.study._storage.get_trial(trial._trial_id)


def _counted(study: optuna.Study) -> int:
    """Trials toward ``n_trials``: finished, running, or failed by their job (a dead worker's trial,
    failed for its heartbeat, is not: the trial queued again in its place is)."""
    trials = study.get_trials(deepcopy=False)
    return sum(t.state in COUNTED or (t.state == TrialState.FAIL and JOB_FAILED in t.system_attrs) for t in trials)


def _tell(study: optuna.Study, trial: optuna.Trial, result: JobReturn, objectives: int) -> Exception | None:
    """Tell the study the job's value; the error where the job failed or returned no number."""
    try:
        value = result.return_value
        values = [float(value)] if objectives == 1 else [float(v) for v in value]
        if len(values) != objectives:
            raise ValueError(f"{objectives} objectives, but the job returned {len(values)} values")
    except Exception as error:
        study._storage.set_trial_system_attr(trial._trial_id, JOB_FAILED, True)
        study.tell(trial, state=TrialState.FAIL)
        log.warning(f"Trial {trial.number} failed: {error}")
        return error
    study.tell(trial, values=values)
    return None


class _Heartbeats:
    """Records a heartbeat for each trial every ``interval`` seconds while the block runs."""

    def __init__(self, study: optuna.Study, trials: list[optuna.Trial], interval: int) -> None:
        self.storage, self.ids, self.interval = study._storage, [t._trial_id for t in trials], interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self) -> None:
        while True:
            for trial_id in self.ids:
                self.storage.record_heartbeat(trial_id)
            if self.stop.wait(self.interval):
                return

    def __enter__(self) -> None:
        for trial_id in self.ids:  # before the block: a trial without a heartbeat is never found stale
            self.storage.record_heartbeat(trial_id)
        self.thread.start()

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
