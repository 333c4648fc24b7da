"""The routing comparison's page section: what each configuration costs (parameters, forward FLOPs,
training time per step) and its validation accuracy at a matched training time, read from its runs.

Every configuration trains the same number of steps, so that the results table compares them at matched
steps; a slower routing had more time for them. At matched time, each run's validation accuracy is read
at the step it had reached when the fastest configuration finished: the training time of a step is the
run's own (``perf/train_epoch_s``, which leaves validation out), and the accuracy is interpolated linearly between
the validations around that step (a run that had finished by then gives its last). Training times are
compared on one machine: where the runs ran on several, the matched time is read from the configurations
whose runs all ran on the machine that ran most of them, and the others show their own step times only."""

from __future__ import annotations

import statistics as stats
from collections import Counter
from pathlib import Path

import numpy as np
import yaml

from capsexp.records.events import event_folder
from capsexp.records.machine import describe_text
from capsexp.records.metric_names import MODEL_FLOPS, MODEL_PARAMETERS, TRAIN_EPOCH_S, VAL_ACC
from capsexp.results import statistics
from capsexp.results.differences import references_of
from capsexp.results.kept_runs import RECORDED_HPARAMS
from capsexp.results.plots import Row, interval_plot, interval_title
from capsexp.results.runs import Configuration, Run, group
from capsexp.results.study import StudyPage

MATCHED_TIME = "matched_time.png"


def training_seconds(run: Run) -> float | None:
    """The run's training time: its epochs' training seconds (as its epoch timer measured them)."""
    epochs = run.scalars.get(TRAIN_EPOCH_S)
    return sum(e.value for e in epochs) if epochs else None


def seconds_per_step(run: Run) -> float | None:
    """The run's training time per step: its epochs' training seconds over the steps they took."""
    epochs = run.scalars.get(TRAIN_EPOCH_S)
    if not epochs or epochs[-1].step <= 0:
        return None
    return training_seconds(run) / epochs[-1].step


def accuracy_at_step(run: Run, step: float) -> float | None:
    """``val/acc`` at ``step``, linear between the validations around it; the last after the run's end
    (it had finished in that time); None before the first validation."""
    curve = run.scalars.get(VAL_ACC)
    if not curve or step < curve[0].step:
        return None
    return float(np.interp(step, [s.step for s in curve], [s.value for s in curve]))


def model_cost(run: Run) -> tuple[int | None, int | None]:
    """Parameters and forward FLOPs per image, as the run recorded them."""
    path = event_folder(run.folder) / RECORDED_HPARAMS
    if not path.exists():
        return None, None
    recorded = yaml.safe_load(path.read_text()) or {}
    return recorded.get(MODEL_PARAMETERS), recorded.get(MODEL_FLOPS)


def _median(configuration: Configuration, measure) -> float | None:
    """The median over the configuration's runs of ``measure(run)``, where it is known."""
    found = [value for run in configuration.runs if (value := measure(run)) is not None]
    return stats.median(found) if found else None


def _machine(run: Run) -> str | None:
    return describe_text(run.machine) if run.machine else None


def timed_configurations(configurations: list[Configuration]) -> tuple[list[Configuration], str | None]:
    """The configurations whose training times compare with each other: all, where every run ran on one
    machine (or none recorded it); else those whose runs all ran on the machine that ran the most runs,
    and that machine."""
    machines = [_machine(run) for c in configurations for run in c.runs]
    if len(set(machines)) <= 1:
        return configurations, None
    most = Counter(machines).most_common(1)[0][0]  # a tie goes to the first run's machine: rebuilds agree
    return [c for c in configurations if all(_machine(run) == most for run in c.runs)], most


def matched_time(configurations: list[Configuration]) -> tuple[float, str] | None:
    """The matched training time: the fastest configuration's (the median of its runs' training times),
    among :func:`timed_configurations`, and its label; None where no run recorded its training time."""
    configurations = timed_configurations(configurations)[0]
    totals = {c.label: total for c in configurations if (total := _median(c, training_seconds)) is not None}
    if not totals:
        return None
    fastest = min(totals, key=totals.get)
    return totals[fastest], fastest


def accuracies_at_time(configuration: Configuration, seconds: float) -> list[float]:
    """Each run's ``val/acc`` at the step it reached in ``seconds`` of training (:func:`accuracy_at_step`)."""
    return [
        a
        for run in configuration.runs
        if (s := seconds_per_step(run)) is not None and (a := accuracy_at_step(run, seconds / s)) is not None
    ]


def figures(runs: list[Run], page: StudyPage) -> dict:
    """The figures this page's notes may quote beyond the tables' (:mod:`capsexp.results.claims`):
    ``at_matched_time(configuration)``, its ``val/acc`` (%) at the matched training time."""
    from capsexp.results.claims import MissingFigure, Spread

    configurations = group(runs)
    found = matched_time(configurations)

    timed = timed_configurations(configurations)[0]

    def at_matched_time(key: str) -> Spread:
        configuration = next((c for c in timed if c.label == key), None)
        values = accuracies_at_time(configuration, found[0]) if configuration and found else []
        if not values:
            raise MissingFigure(f"no {VAL_ACC} at the matched time for {key!r}")
        summary = statistics.summarise([100 * v for v in values], (0.0, 100.0))
        return Spread(summary.mean, summary.std, summary.n, summary.low, summary.high)

    return {"at_matched_time": at_matched_time}


def cost_and_matched_time(runs: list[Run], page: StudyPage, output: Path) -> str:
    """The section: per configuration, parameters, MFLOPs, median training seconds per step and, at the
    fastest configuration's training time, the steps reached and the validation accuracy (mean ± std and
    95% interval over runs)."""
    configurations = group(runs)
    if (found := matched_time(configurations)) is None:
        return ""
    matched, fastest = found
    timed, machine = timed_configurations(configurations)
    references = [c.label for c in references_of(configurations, page)]
    rows = []
    lines = [
        "| configuration | parameters | MFLOPs per image | training s per step | steps in the matched time "
        f"| {VAL_ACC} at the matched time | 95% CI |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for configuration in configurations:
        parameters, flops = model_cost(configuration.runs[0])
        per_step = _median(configuration, seconds_per_step)
        compared = configuration in timed
        at_time = accuracies_at_time(configuration, matched) if compared else []
        summary = statistics.summarise(at_time, (0.0, 1.0)) if at_time else None
        if at_time:
            rows.append(
                Row(configuration.label, [100 * a for a in at_time], configuration.label in references, (0.0, 100.0))
            )
        cells = [
            configuration.label,
            f"{parameters:,}" if parameters is not None else "",
            f"{flops / 1e6:,.1f}" if flops is not None else "",
            f"{per_step:.3f}" if per_step is not None else "",
            f"{matched / per_step:.0f}" if per_step and compared else "",
            summary.text(100) if summary else ("" if compared else "another machine"),
            f"[{100 * summary.low:.2f}, {100 * summary.high:.2f}]" if summary and summary.low is not None else "",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    title = f"{VAL_ACC} after {matched:.0f} s of training, the fastest configuration's time: " + interval_title(
        [len(row.values) for row in rows], bounded=[True]
    )
    figure = (
        interval_plot([(f"{VAL_ACC} at the matched time (%)", rows)], output / MATCHED_TIME, title) if rows else None
    )
    return (
        "## Cost, and accuracy at matched training time\n\n"
        "Parameters and forward MFLOPs per image (matrix products and convolutions, 2 per multiply-add) as each "
        "run recorded them; training seconds per step: the median over the runs of each run's training time "
        f"(`{TRAIN_EPOCH_S}`) over its steps, as the runs ran (see the notes for what shared the machine and "
        "what the time holds). "
        f"Matched time: {matched:.0f} s of training, the median of `{fastest}`, the fastest configuration, "
        f"over its runs. Each run's {VAL_ACC} at the step it reached in that time, interpolated between the "
        f"validations around it; mean ± std over the runs (%), and the 95% CI ({statistics.BOUNDED_INTERVAL})."
        + (
            f" Training times compare on one machine only: the matched time is that of the runs on {machine}, "
            "which ran most of them; the configurations run elsewhere show their own step times, not comparable "
            "with the others', and no accuracy at the matched time."
            if machine
            else ""
        )
        + "\n\n"
        + (f"![{figure.stem}]({figure.name})\n\n" if figure else "")
        + "\n".join(lines)
        + "\n"
    )
