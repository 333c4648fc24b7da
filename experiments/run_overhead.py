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
"""

from __future__ import annotations

import argparse
import datetime
import re
import statistics
from collections import defaultdict
from pathlib import Path

from capsexp.records.events import read_scalars
from capsexp.records.machine import describe_text, read_machine
from capsexp.records.metric_names import TRAIN_EPOCH_S

RESULTS = Path(__file__).resolve().parent / "results" / "run_overhead.md"
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[[^]]*\]\[\w+\] - (.*)$")
# The log lines that open and close the phases (capsexp.progress, capsexp.run.stages, capsexp.run.train).
TRAINING_STARTS, TRAINING_ENDS = "training: ", "training done: "
TESTING_STARTS, CARD_WRITTEN = "Testing ", "Model card: "


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


def arm_of(run: Path) -> str:
    """The run's configuration as its folder names it, without the seed."""
    return ",".join(part for part in run.name.split(",") if not part.startswith("seed="))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="a sweep's folder, or a page's runs/")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    runs = sorted(path.parent for path in args.folder.rglob("capsexp.log") if (path.parent / ".hydra").is_dir())
    measured = {run: found for run in runs if (found := phases(run)) is not None}
    if not measured:
        raise SystemExit(f"no finished run under {args.folder} logged its phases")
    by_arm: dict[str, list[dict[str, float]]] = defaultdict(list)
    for run, found in measured.items():
        by_arm[arm_of(run)].append(found)
    names = ("set-up", "training steps", "validation", "test")
    machines = {describe_text(m) for run in measured if (m := read_machine(run))}

    def row(label: str, found: list[dict[str, float]]) -> str:
        medians = {name: statistics.median(f[name] for f in found) for name in names}
        shares = [(f["set-up"] + f["validation"] + f["test"]) / f["training steps"] for f in found]
        cells = " | ".join(f"{medians[name]:.1f}" for name in names)
        return f"| {label} | {len(found)} | {cells} | {100 * statistics.median(shares):.1f}% |"

    everything = [found for group in by_arm.values() for found in group]
    shown = args.folder.resolve()
    lines = [
        "# What a study's run spends beside training",
        "",
        f"Written by `experiments/run_overhead.py` from {len(measured)} finished runs of "
        f"`{shown.relative_to(Path.cwd().resolve()) if shown.is_relative_to(Path.cwd().resolve()) else shown}`; "
        f"machine: {'; '.join(sorted(machines)) or 'not recorded'}.",
        "",
        "Seconds per run, medians over the runs of each configuration: set-up (the job's first log line to "
        "training; a sweep's worker has imported capsexp already), the training steps alone "
        "(`perf/train_epoch_s`), validation (the fit's wall time less its steps) and test (the test sets, the "
        "routing measures, the equivariance and the model card). Overhead: set-up, validation and test as a "
        "share of the training steps, the median of each run's share.",
        "",
        "| configuration | runs | set-up | training steps | validation | test | overhead |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        row("every run", everything),
        *(row(arm, found) for arm, found in sorted(by_arm.items())),
        "",
    ]
    args.output.write_text("\n".join(lines))
    print("\n".join(lines[:12]))


if __name__ == "__main__":
    main()
