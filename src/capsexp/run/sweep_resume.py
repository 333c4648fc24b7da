"""A multirun run again with the same ``hydra.sweep.dir`` finishes what an earlier one started.

Each job's folder says how far it got:

- **finished**: it holds :data:`FINISHED` (the metrics the job returned, written as its last act). The
  job is not run again and its folder is not touched; its recorded metrics stand for it.
- **interrupted**: it holds ``checkpoints/last.ckpt`` but did not finish (the machine died, the job was
  killed or failed). The job goes on from that state in its folder, exactly as ``ckpt_path=<run folder>``
  resumes a single run (:mod:`capsexp.run.resume`); what its event files hold past that state is
  hidden from TensorBoard and the pages (:func:`capsexp.run.run_folder.steps_to_hide`).
- otherwise it is **started** (again, from step 0).

:class:`SkipsFinishedJobs`, in Hydra's basic sweeper (``hydra/sweeper=resumable``, the default of
``conf/hydra/default.yaml``), says which jobs are which in one line and launches only those not
finished, with their own job numbers, with whichever launcher is configured (local, joblib, submitit).
:func:`continue_job` makes a launched job go on from its state. The page and a study's after-sweep
steps run once, when every job has ended (:mod:`capsexp.results.sweep_page`).

A folder whose recorded overrides differ from the job's (the same ``hydra.sweep.dir`` given to another
sweep) is refused with a message: the sweep would mix two experiments.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from omegaconf import DictConfig, OmegaConf, open_dict

from capsexp.errors import CapsexpError
from capsexp.locations import LAST_CHECKPOINT, OVERRIDES, is_setting
from capsexp.overrides import hydra_value, without

log = logging.getLogger("capsexp")

FINISHED = "metrics.yaml"  # in a run's folder: the metrics it returned, written when it finished
SKIPPED, RESUMED, STARTED = "skipped", "resumed", "started"


def write_finished(folder: Path, metrics: dict[str, float]) -> None:
    """Record that the run in ``folder`` finished, with the metrics it returns (atomically: a run killed
    while writing it has not finished)."""
    partial = folder / f"{FINISHED}.partial"
    partial.write_text(yaml.safe_dump({name: float(value) for name, value in sorted(metrics.items())}))
    partial.replace(folder / FINISHED)


def finished_metrics(folder: Path) -> dict[str, float] | None:
    """The metrics of the finished run in ``folder``; None where it did not finish."""
    record = folder / FINISHED
    return yaml.safe_load(record.read_text()) or {} if record.is_file() else None


def job_state(folder: Path) -> str:
    """:data:`SKIPPED` (finished), :data:`RESUMED` (a saved state to go on from) or :data:`STARTED`."""
    if (folder / FINISHED).is_file():
        return SKIPPED
    return RESUMED if (folder / LAST_CHECKPOINT).is_file() else STARTED


def check_same_job(folder: Path, overrides: Sequence[str]) -> None:
    """:class:`CapsexpError` when ``folder`` holds a run of other settings than ``overrides`` (locations
    and labels aside: the data may sit elsewhere on another machine)."""
    recorded_file = folder / OVERRIDES
    if not recorded_file.is_file():
        return
    recorded = [str(o) for o in yaml.safe_load(recorded_file.read_text()) or [] if is_setting(str(o))]
    settings = without([str(o) for o in overrides if is_setting(str(o))], "ckpt_path")
    recorded = without(recorded, "ckpt_path")
    if sorted(recorded) != sorted(settings):
        only_then = sorted(set(recorded) - set(settings))
        only_now = sorted(set(settings) - set(recorded))
        raise CapsexpError(
            f"{folder} holds a job of other settings (there: {' '.join(only_then) or 'none'}; now: "
            f"{' '.join(only_now) or 'none'}).\nA sweep folder is finished by the command that started it: "
            "give that command, or a new hydra.sweep.dir for a new sweep"
        )


def continue_job(cfg: DictConfig) -> tuple[DictConfig, dict[str, float] | None]:
    """For a job of a multirun: ``(cfg, metrics)`` where its folder holds a finished run (nothing to run),
    ``(cfg with ckpt_path=<folder>/checkpoints/last.ckpt, None)`` where it holds a saved state, else
    ``(cfg, None)``. A single run, or a job given its own ``ckpt_path``, is left as it is."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN or cfg.get("ckpt_path"):
        return cfg, None
    folder = Path(HydraConfig.get().runtime.output_dir)
    state = job_state(folder)
    if state == SKIPPED:
        log.info(f"{folder} finished before: its recorded metrics stand, nothing is run again")
        return cfg, finished_metrics(folder)
    if state == RESUMED:
        with open_dict(cfg):
            cfg.ckpt_path = str(folder / LAST_CHECKPOINT)
        log.info(f"Resuming this job from {cfg.ckpt_path}")
    return cfg, None


def after_sweep_arguments(arguments: list[str], folder: Path) -> list[str] | None:
    """The command line of a run a study's after-sweep step makes in ``folder`` (``arguments`` end with
    its ``hydra.run.dir``): None where that run finished before (a continued sweep runs each step's
    runs once), the arguments going on from its ``last.ckpt`` where it saved a state, else the arguments."""
    state = job_state(folder)
    if state == SKIPPED:
        log.info(f"{folder} finished before: not run again")
        return None
    if state == RESUMED:
        return [*without(arguments, "ckpt_path"), f"ckpt_path={hydra_value(folder / LAST_CHECKPOINT)}"]
    return arguments


class SkipsFinishedJobs:
    """Makes a sweeper's launcher skip finished jobs (see the module docstring): mixed into Hydra's basic
    sweeper by ``hydra_plugins.capsexp_sweepers.ResumableSweeper``. A mixin, not a subclass: Hydra
    re-executes its plugin modules each time it scans them (once per process on the command line, again
    in a test's process), and a class defined once here would keep the first scan's BasicSweeper."""

    launcher: Launcher | None
    config: DictConfig | None
    hydra_context: Any

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)  # type: ignore[misc]
        earlier = Path(config.hydra.sweep.dir)
        assert self.launcher is not None
        self.launcher = _SkipFinished(self.launcher, self, continues=earlier.is_dir())


class _SkipFinished(Launcher):
    """Wraps the configured launcher: a batch's finished jobs are not launched, the others are, in runs
    of consecutive jobs so that each keeps its number (and so its folder)."""

    def __init__(self, launcher: Launcher, sweeper: SkipsFinishedJobs, continues: bool) -> None:
        self.launcher, self.sweeper, self.continues = launcher, sweeper, continues

    def setup(self, **kwargs: Any) -> None:  # the wrapped launcher is set up already
        pass

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        sweep_dir = Path(self.sweeper.config.hydra.sweep.dir)
        finishing = "The sweep stopped; this finishes it (finished jobs skipped, stopped ones resumed): "
        with last_line_if_stopped(lambda: finishing + finishing_command(sweep_dir)):
            return self._launch(job_overrides, initial_job_idx, sweep_dir)

    def _launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int, sweep_dir: Path
    ) -> Sequence[JobReturn]:
        config = self.sweeper.config
        if not self.continues:
            if initial_job_idx == 0:
                _say_how_to_finish(sweep_dir)
            return self.launcher.launch(job_overrides, initial_job_idx)
        folders = [self._folder(list(o), initial_job_idx + i) for i, o in enumerate(job_overrides)]
        for folder, overrides in zip(folders, job_overrides, strict=True):
            check_same_job(folder, overrides)
        states = [job_state(folder) for folder in folders]
        _say_states(sweep_dir, folders, states)
        returns: list[JobReturn] = []
        start = 0
        while start < len(job_overrides):
            if states[start] == SKIPPED:
                returns.append(_recorded_return(job_overrides[start], folders[start], config))
                start += 1
                continue
            end = start
            while end < len(job_overrides) and states[end] != SKIPPED:
                end += 1
            returns += self.launcher.launch(job_overrides[start:end], initial_job_idx + start)
            start = end
        return returns

    def _folder(self, overrides: list[str], number: int) -> Path:
        """The folder Hydra gives job ``number`` of ``overrides`` (as a launcher composes it)."""
        config = self.sweeper.hydra_context.config_loader.load_sweep_config(self.sweeper.config, overrides)
        with open_dict(config):
            config.hydra.job.id = number
            config.hydra.job.num = number
        return Path(config.hydra.sweep.dir) / str(config.hydra.sweep.subdir)


def _recorded_return(overrides: Sequence[str], folder: Path, config: DictConfig) -> JobReturn:
    """A finished job's :class:`JobReturn`: its recorded value of ``optimized_metric``."""
    metrics = finished_metrics(folder) or {}
    return JobReturn(
        overrides=list(overrides),
        working_dir=str(folder),
        task_name=str(config.hydra.job.name),
        status=JobStatus.COMPLETED,
        _return_value=metrics.get(str(OmegaConf.select(config, "optimized_metric", default=""))),
    )


def _say_states(sweep_dir: Path, folders: list[Path], states: list[str]) -> None:
    counts = {state: states.count(state) for state in (SKIPPED, RESUMED, STARTED)}
    log.info(
        f"Continuing the sweep in {_shown(sweep_dir)}: {counts[SKIPPED]} finished (skipped), "
        f"{counts[RESUMED]} resumed from their last.ckpt, {counts[STARTED]} started"
    )
    for folder, state in zip(folders, states, strict=True):
        if state != STARTED or folder.is_dir():
            log.info(f"  {state}: {folder.name}")


def finishing_command(sweep_dir: Path) -> str:
    """The command that finishes this sweep: this one, in this sweep's folder."""
    arguments = without(sys.argv[1:], "hydra.sweep.dir")
    return shlex.join(["python", "-m", "capsexp", *arguments, f"hydra.sweep.dir={hydra_value(_shown(sweep_dir))}"])


def _say_how_to_finish(sweep_dir: Path) -> None:
    log.info(f"Sweep folder: {_shown(sweep_dir)}; if it is stopped, this finishes it: {finishing_command(sweep_dir)}")


@contextlib.contextmanager
def last_line_if_stopped(line: Callable[[], str]) -> Iterator[None]:
    """Ctrl-C or a signal in the block, in this process or a job's (whose own message says where its state
    is): ``line()`` printed as the last line, after whatever the stopped job printed (the command that
    finishes the whole sweep or search, not the stopped job alone); Ctrl-C outside training then ends the
    process with 130 and no traceback. Other exits pass through."""
    try:
        yield
    except (KeyboardInterrupt, SystemExit) as stopped:
        if isinstance(stopped, SystemExit) and not _by_signal(stopped.code):
            raise
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        print(f"\n{line()}", file=sys.stderr, flush=True)
        if isinstance(stopped, KeyboardInterrupt):
            raise SystemExit(128 + signal.SIGINT) from None
        raise


def _by_signal(code: object) -> bool:
    """An exit status of a process a signal stopped (128 + its number: capsexp.errors.Interrupted)."""
    return isinstance(code, int) and code > 128


def _shown(path: Path) -> Path:
    from capsexp.locations import shown_path

    return shown_path(path.resolve())
