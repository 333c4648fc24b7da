"""The runs under a folder, read back for a comparison: each run's overrides, seed, scalars, duration
and machine, and the configurations they form (runs whose overrides differ only by ``seed``)."""

from __future__ import annotations

import bisect
import datetime
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from capsexp.locations import OVERRIDES, is_setting
from capsexp.overrides import is_override, left_side, values_of, written
from capsexp.overrides import key as override_key
from capsexp.records.events import Scalar, event_files, load_events, writer_of
from capsexp.records.machine import describe_text, read_machine
from capsexp.records.metric_names import is_accuracy
from capsexp.records.revision import read_revision
from capsexp.records.revision import short as short_revision
from capsexp.results import statistics

# A run launched with other overrides than the experiment config's that composes the same job keeps
# them here (tests/test_studies.py checks that both compose the same job).
OVERRIDES_AS_RUN = Path(".hydra") / "overrides_as_run.yaml"


def is_seed(override: str) -> bool:
    """Whether ``override`` sets the seed (``seed=3``, ``+seed=3``, ``++seed=3``)."""
    return is_override(override) and override_key(override) == "seed"


def mixed_provenance(runs: list[Run]) -> str | None:
    """Why ``runs`` cannot stand as one confirmatory study (None where they can): they ran more than one
    code revision, uncommitted changes or more than one machine, or some record their code or machine and
    others do not. Runs none of which keeps a record (from before runs kept them) are read as they were."""
    reasons = []
    versions = {short_revision(run.revision) for run in runs if run.revision}
    dirty = any("+changes" in version for version in versions)
    if len(versions) > 1:
        reasons.append(f"its runs ran {len(versions)} versions of the code" + (", some uncommitted" if dirty else ""))
    elif dirty:
        reasons.append("its runs ran uncommitted changes")
    machines = {describe_text(run.machine) for run in runs if run.machine}
    if len(machines) > 1:
        reasons.append(f"its runs ran on {len(machines)} machines")
    for record, unrecorded in (
        ("code", [r for r in runs if not r.revision]),
        ("machine", [r for r in runs if not r.machine]),
    ):
        if 0 < len(unrecorded) < len(runs):
            reasons.append(
                f"{len(unrecorded)} of its {len(runs)} runs {'keeps' if len(unrecorded) == 1 else 'keep'} "
                f"no record of their {record}"
            )
    return ", and ".join(reasons) or None


KEPT_RUNS = "runs"  # the folder beside a page that holds copies of its runs (compare --keep-runs)
KEPT_ORDER = "order.yaml"  # beside a page's kept runs: their folders in the order the page lists them


@dataclass
class Run:
    folder: Path
    overrides: list[str]
    scalars: dict[str, list[Scalar]] = field(default_factory=dict)
    start: float | None = None  # wall time (s since the epoch) of the first and the last scalar logged
    end: float | None = None
    machine: dict | None = None
    revision: dict | None = None  # the code that ran (capsexp.records.revision)
    spans: tuple[float, ...] = ()  # seconds each process that logged it spent on it: :func:`process_spans`
    configuration: str = ""  # set by label_configurations

    @property
    def seed(self) -> int | None:
        """The ``seed=N`` override; None for a run that left the config's seed (a number many runs share)."""
        values = values_of(self.overrides, "seed")
        return int(values[-1]) if values and values[-1].lstrip("-").isdigit() else None

    @property
    def setting(self) -> tuple[str, ...]:
        """The overrides that make the run what it is (no seed, no location), sorted."""
        return tuple(sorted(o for o in self.overrides if is_setting(o) and not is_seed(o)))

    @property
    def seconds(self) -> float | None:
        """The run's duration, kept by a copy of its event files: first to last scalar of each process
        that logged it, summed (a run stopped and resumed is not timed while it was stopped)."""
        return sum(self.spans) if self.spans else None

    def final(self, tag: str) -> float | None:
        values = self.scalars.get(tag)
        return values[-1][1] if values else None

    def choice(self, key: str) -> str | None:
        """The value of the ``key=value`` override (``experiment``, ``study``), None without one."""
        values = values_of(self.overrides, key)
        return values[-1] if values else None


@dataclass
class Configuration:
    label: str
    runs: list[Run]

    def values(self, metric: str) -> list[tuple[int | None, float]]:
        """``(seed, final value)`` of ``metric`` for each run that logged it (seed None: not set by an override)."""
        return [(run.seed, value) for run in self.runs if (value := run.final(metric)) is not None]

    def summary(self, metric: str) -> statistics.Summary | None:
        values = [v for run in self.runs if (v := run.final(metric)) is not None]
        return statistics.summarise(values, (0.0, 1.0) if is_accuracy(metric) else None) if values else None


def group(runs: list[Run]) -> list[Configuration]:
    """The configurations, in the order of their first run."""
    members: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        members[run.configuration].append(run)
    return [Configuration(label, found) for label, found in members.items()]


def _natural(path: Path) -> list[tuple[int, str]]:
    """Job folders in job order: ``2`` before ``10``, numbers before names."""
    return [(int(part), "") if part.isdigit() else (1 << 62, part) for part in path.parts]


def _job_number(run_dir: Path) -> int | None:
    """The run's number in its multirun (Hydra's ``.hydra/hydra.yaml``); None for a single run, or a
    run kept on a results page (which keeps no hydra.yaml)."""
    record = run_dir / ".hydra" / "hydra.yaml"
    if not record.is_file():
        return None
    number = ((yaml.safe_load(record.read_text()) or {}).get("hydra") or {}).get("job", {}).get("num")
    return number if isinstance(number, int) else None


def process_spans(times: list[float], files: list[Path]) -> tuple[float, ...]:
    """The time each process that logged a run spent on it, in the order they ran: its first to last
    scalar (a process: the writer of event files, :func:`capsexp.records.events.writer_of`). A run resumed
    after a stop is logged by a second process, so the wait between the first one's last scalar and the
    second one's first is in neither. A scalar belongs to the process whose first file opened last before
    it (a run's processes follow one another; a file's time is whole seconds)."""
    opened: dict[str, int] = {}
    for file in files:
        writer, when = writer_of(file)
        opened[writer] = min(when, opened.get(writer, when))
    starts = sorted(opened.values())[1:]  # the first process takes every scalar before the second opened
    spans: dict[int, list[float]] = {}
    for t in times:
        spans.setdefault(bisect.bisect_right(starts, int(t)), []).append(t)
    return tuple(max(spans[n]) - min(spans[n]) for n in sorted(spans))


def find_runs(folder: Path) -> list[Run]:
    """Every run under ``folder`` (a folder with ``.hydra/overrides.yaml`` and event files), in job
    order (runs kept on a page: in the order they started), with its scalars, span and machine."""
    runs = []
    for overrides_file in sorted(folder.rglob(str(OVERRIDES)), key=_natural):
        run_dir = overrides_file.parent.parent
        if not event_files(run_dir):
            continue
        events = load_events(run_dir)
        scalars = {tag: [Scalar(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
        times = [e.wall_time for tag in events.Tags()["scalars"] for e in events.Scalars(tag)]
        spans = process_spans(times, event_files(run_dir))
        overrides = [str(o) for o in yaml.safe_load(overrides_file.read_text()) or []]
        runs.append(
            Run(
                run_dir,
                overrides,
                scalars,
                min(times, default=None),
                max(times, default=None),
                read_machine(run_dir),
                read_revision(run_dir),
                spans=spans,
            )
        )
    numbers = {run.folder: _job_number(run.folder) for run in runs}
    if all(number is not None for number in numbers.values()):
        return sorted(runs, key=lambda run: numbers[run.folder])
    # Runs kept on a page: in the order the page listed them (KEPT_ORDER), else numbered job folders
    # (kept before the order was) in number order, else in the order they started.
    if (folder / KEPT_ORDER).is_file():
        order = {name: i for i, name in enumerate(yaml.safe_load((folder / KEPT_ORDER).read_text()) or [])}
        return sorted(runs, key=lambda run: order.get(run.folder.relative_to(folder).as_posix(), len(order)))
    if all(run.folder.name.isdigit() for run in runs):
        return runs
    return sorted(runs, key=lambda run: (run.start is None, run.start or 0.0))


def label_configurations(runs: list[Run]) -> list[str]:
    """Label each run's configuration by the overrides that set it apart from the others (in the
    order given on the command line); return those every run shares."""
    settings = {run.setting for run in runs}
    shared = set.intersection(*map(set, settings)) if len(settings) > 1 else set()
    for run in runs:
        kept = [o for o in dict.fromkeys(run.overrides) if o in run.setting and o not in shared]
        run.configuration = " ".join(kept) or "(defaults)"
    first = runs[0].overrides if runs else []
    return [o for o in first if o in shared]


MULTIRUN = "multirun.yaml"  # Hydra's record of a multirun, in its folder: the command line among it
SWEEP_COMMAND = "command.yaml"  # the multirun's command-line overrides, kept beside a page's runs


def command_line(folder: Path) -> list[str] | None:
    """The overrides the multirun in ``folder`` was started with (Hydra's ``multirun.yaml``, or the
    copy a page keeps beside its runs), locations left out; None for runs of no one command."""
    if (folder / MULTIRUN).is_file():
        given = yaml.safe_load((folder / MULTIRUN).read_text())["hydra"]["overrides"]["task"]
    elif (folder / SWEEP_COMMAND).is_file():
        given = yaml.safe_load((folder / SWEEP_COMMAND).read_text())
    else:
        return None
    return [str(o) for o in given if is_setting(str(o)) or override_key(str(o)) == "task_name"]


def launches(runs: list[Run], folder: Path) -> list[tuple[Path, list[str] | None, list[Run]]]:
    """The launches that made the runs: for each folder under ``folder`` that records a multirun's
    command (:func:`command_line`), the command and the runs under it (the deepest such folder of a
    run's); runs under none form one launch of no recorded command. In the order of their first run."""
    found: dict[Path, list[Run]] = {}
    for run in runs:
        home = next(
            (
                parent
                for parent in (run.folder, *run.folder.parents)
                if parent.is_relative_to(folder) and command_line(parent) is not None
            ),
            None,
        )
        found.setdefault(home, []).append(run)
    return [(home or folder, command_line(home) if home else None, members) for home, members in found.items()]


def sweep_command(runs: list[Run], given: list[str] | None = None) -> str:
    """The command that made the runs: the multirun's own overrides (``given``: :func:`command_line`), else
    one that runs every run's overrides, each key with its values in the order the runs first took them
    (Hydra's sweep over their product; a hand-made set of runs may be a part of it). Locations
    (``hydra.``, ``paths.``) are left out: they name this machine's folders."""
    if given is not None:
        return " ".join(["python -m capsexp -m", *given])
    values: dict[str, list[str]] = {}
    for run in runs:
        for override in run.overrides:
            if not is_setting(override) and override_key(override) != "task_name":
                continue
            key, value = left_side(override), written(override)
            values.setdefault(key, [])
            if value not in values[key]:
                values[key].append(value)
    arguments = [f"{key}={','.join(choices)}" for key, choices in values.items()]
    return " ".join(["python -m capsexp", *(["-m"] if len(runs) > 1 else []), *arguments])


def dates(runs: list[Run]) -> str:
    """The days the runs ran, from their event times (UTC): ``2026-11-27`` or ``2026-11-26 to 2026-11-27``."""
    times = [t for run in runs for t in (run.start, run.end) if t is not None]
    if not times:
        return "unknown dates"
    days = [
        datetime.datetime.fromtimestamp(t, datetime.timezone.utc).date().isoformat() for t in (min(times), max(times))
    ]
    return days[0] if days[0] == days[1] else f"{days[0]} to {days[1]}"
