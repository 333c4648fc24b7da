"""What a study's run spends beside training, from the runs of a sweep: writes experiments/results/run_overhead.md.

Each run's own log (``capsexp.log``, one line a phase, timestamped) and its ``perf/train_epoch_s``
(callbacks.epoch_timer: training steps alone, validations left out) give its phases:

- set-up: the job's first line to the start of training (config, data, the net, the loggers; a sweep's
  worker has imported capsexp already, so no imports);
- validation: the fit's wall time less its training steps;
- test: the start of testing to the model card, the last thing the run writes (the test sets, the
  routing measures and the equivariance after them, the card).

Overhead is the three together, as a share of the training steps' time. Run where the runs are:

    python experiments/run_overhead.py logs/routing_reference/multiruns/<time>      # a sweep's folder
    python experiments/run_overhead.py experiments/results/routing_reference_quick/runs   # a page's runs
    python experiments/run_overhead.py <sweep> --keep-runs --output experiments/results/run_overhead/README.md
"""

from __future__ import annotations

import argparse
import datetime
import re
import statistics
from collections import defaultdict
from pathlib import Path

import yaml

from capsexp.records.events import read_scalars
from capsexp.records.machine import describe_text, read_machine
from capsexp.records.metric_names import TRAIN_EPOCH_S
from capsexp.records.revision import read_revision
from capsexp.records.revision import short as short_revision
from capsexp.results.kept_runs import MACHINE_PATH
from capsexp.results.kept_runs import keep_runs as keep_runs_of_page
from capsexp.results.runs import find_runs

RESULTS = Path(__file__).resolve().parent / "results" / "run_overhead.md"
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[[^]]*\]\[\w+\] - (.*)$")
# The log lines that open and close the phases (capsexp.progress, capsexp.run.stages, capsexp.run.train).
TRAINING_STARTS, TRAINING_ENDS = "training: ", "training done: "
TESTING_STARTS, CARD_WRITTEN = "Testing ", "Model card: "
OVERHEAD = ("set-up", "validation", "test")  # the phases beside the training steps


def phases(run: Path) -> dict[str, float] | None:
    """Seconds of a finished run's set-up, training steps, validation and test; None for a run that did
    not log every phase (it did not finish, or was resumed: its log holds two fits), or whose training
    time holds its validations."""
    times: dict[str, list[datetime.datetime]] = defaultdict(list)
    lines = [m for line in (run / "capsexp.log").read_text().splitlines() if (m := STAMP.match(line))]
    if not lines:
        return None
    first = datetime.datetime.strptime(lines[0][1], "%Y-%m-%d %H:%M:%S,%f")
    for match in lines:
        for marker in (TRAINING_STARTS, TRAINING_ENDS, TESTING_STARTS, CARD_WRITTEN):
            if match[2].startswith(marker):
                times[marker].append(datetime.datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f"))
    training = read_scalars(run).get(TRAIN_EPOCH_S)
    if any(len(times[m]) != 1 for m in (TRAINING_STARTS, TRAINING_ENDS, TESTING_STARTS, CARD_WRITTEN)) or not training:
        return None
    steps = sum(scalar.value for scalar in training)
    fit = (times[TRAINING_ENDS][0] - times[TRAINING_STARTS][0]).total_seconds()
    if fit - steps < 0.05 and "validation at step" in (run / "capsexp.log").read_text():
        return None  # an epoch timer that counted its validations as training: the phases cannot be told apart
    return {
        "set-up": (times[TRAINING_STARTS][0] - first).total_seconds(),
        "training steps": steps,
        "validation": fit - steps,
        "test": (times[CARD_WRITTEN][0] - times[TESTING_STARTS][0]).total_seconds(),
    }


def keep_runs(folder: Path, output: Path) -> Path:
    """The runs under ``folder`` kept in ``output/runs/`` as a results page keeps them
    (:func:`capsexp.results.kept_runs.keep_runs`), with the log this page reads: its mentions of the run's
    own location (its folder, checkpoint and card) replaced by :data:`MACHINE_PATH`."""
    runs = find_runs(folder)
    kept = keep_runs_of_page(runs, folder, output)
    for run in runs:
        text = (run.folder / "capsexp.log").read_text()
        for location in (str(run.folder.resolve()), str(run.folder)):
            text = text.replace(location, MACHINE_PATH)
        (kept / run.folder.relative_to(folder) / "capsexp.log").write_text(text)
    return kept


def arm_of(run: Path) -> str:
    """The run's configuration as its folder names it, without the seed."""
    return ",".join(part for part in run.name.split(",") if not part.startswith("seed="))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="a sweep's folder, or a page's runs/")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--keep-runs",
        action="store_true",
        help="copy what the page reads of each run into runs/ beside --output, and write the page from there",
    )
    args = parser.parse_args()
    if args.keep_runs:
        args.folder = keep_runs(args.folder, args.output.parent)
    runs = sorted(path.parent for path in args.folder.rglob("capsexp.log") if (path.parent / ".hydra").is_dir())
    measured = {run: found for run in runs if (found := phases(run)) is not None}
    if not measured:
        raise SystemExit(f"no finished run under {args.folder} logged its phases")
    by_arm: dict[str, list[dict[str, float]]] = defaultdict(list)
    for run, found in measured.items():
        by_arm[arm_of(run)].append(found)
    names = ("set-up", "training steps", "validation", "test")
    machines = {describe_text(m) for run in measured if (m := read_machine(run))}
    codes = {short_revision(read_revision(run)) for run in measured}

    def row(label: str, found: list[dict[str, float]]) -> str:
        medians = {name: statistics.median(f[name] for f in found) for name in names}

        def share(*phases: str) -> str:
            return f"{100 * statistics.median(sum(f[p] for p in phases) / f['training steps'] for f in found):.1f}%"

        cells = " | ".join(f"{medians[name]:.1f}" for name in names)
        return f"| {label} | {len(found)} | {cells} | {share('validation')} | {share('test')} | {share(*OVERHEAD)} |"

    everything = [found for group in by_arm.values() for found in group]
    shown = args.folder.resolve()
    here = Path.cwd().resolve()
    where = shown.relative_to(here) if shown.is_relative_to(here) else shown
    page = where.parent / "README.md"
    lines = [
        "# What a study's run spends beside training",
        "",
        f"Written by `experiments/run_overhead.py` from {len(measured)} finished runs of "
        f"`{where}`; "
        f"machine: {'; '.join(sorted(machines)) or 'not recorded'}; code: {', '.join(sorted(codes))}.",
        "",
        "Seconds per run, medians over the runs of each configuration: set-up (the job's first log line to "
        "training; a sweep's worker has imported capsexp already), the training steps alone "
        "(`perf/train_epoch_s`), validation (the fit's wall time less its steps) and test (the test sets, the "
        "routing measures, the equivariance and the model card). Overhead: set-up, validation and test as a "
        "share of the training steps, the median of each run's share (validation's and test's alone beside it).",
        "",
        "On a shared machine the seconds move with other work; the shares less, every phase being slowed alike. "
        "With `--keep-runs` the runs' logs, overrides, records and events are kept in `runs/` beside the page "
        "(their locations left out).",
        "",
        "The runs, each as `python -m capsexp` with its overrides:",
        "",
        *(f"- `{' '.join(yaml.safe_load((run / '.hydra' / 'overrides.yaml').read_text()))}`" for run in measured),
        "",
        *(
            [f"Rebuild, from the checkout: `python experiments/run_overhead.py {where} --output {page}`.", ""]
            if where.name == "runs"  # kept runs, the page beside them
            else []
        ),
        "| configuration | runs | set-up | training steps | validation | test | validation share | test share "
        "| overhead |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        row("every run", everything),
        *(row(arm, found) for arm, found in sorted(by_arm.items())),
        "",
    ]
    args.output.write_text("\n".join(lines))
    print("\n".join(lines[:12]))


if __name__ == "__main__":
    main()
