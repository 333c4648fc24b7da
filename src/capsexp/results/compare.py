"""Runs compared: found under a folder, grouped by configuration (runs whose overrides differ only by
``seed`` form one), summarised as mean ± std over seeds, written as tables and plots. The command line
is ``python -m capsexp.compare`` (:mod:`capsexp.compare`)."""

from __future__ import annotations

import csv
import math
import re
import statistics
import textwrap
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from capsexp.errors import NoRunsError
from capsexp.results.events import Scalar, read_scalars
from capsexp.results.metric_names import PRESENCE_GAP, TEST_ACC, VAL_ACC, VAL_ACC_BEST, rotation_angle

# Overrides that name where a run went, not what it was.
IGNORED_OVERRIDE = re.compile(r"^\+?(seed|hydra\.[\w.]+|paths\.[\w.]+|ckpt_path|tags|task_name)=")


@dataclass
class Run:
    configuration: tuple[str, ...] | str  # the overrides, then (label_configurations) a label
    scalars: dict[str, list[Scalar]] = field(default_factory=dict)

    def final(self, tag: str) -> float | None:
        values = self.scalars.get(tag)
        return values[-1][1] if values else None


def find_runs(folder: Path) -> list[Run]:
    """Every run under ``folder``, with its configuration label and its scalars."""
    runs = []
    for overrides_file in sorted(folder.rglob(".hydra/overrides.yaml")):
        run_dir = overrides_file.parent.parent
        if not (run_dir / "tensorboard").is_dir():
            continue
        overrides = yaml.safe_load(overrides_file.read_text()) or []
        kept = tuple(sorted(o for o in overrides if not IGNORED_OVERRIDE.match(o)))
        runs.append(Run(kept, read_scalars(run_dir)))
    return runs


def label_configurations(runs: list[Run]) -> list[str]:
    """Label each run's configuration by the overrides that set it apart; return those all share."""
    configurations = {run.configuration for run in runs}
    shared = set.intersection(*map(set, configurations)) if len(configurations) > 1 else set()
    for run in runs:
        run.configuration = " ".join(o for o in run.configuration if o not in shared) or "(defaults)"
    return sorted(shared)


def _mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample std; no std for a single run (it would read as a spread of 0)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def summarise(runs: list[Run]) -> tuple[list[str], list[dict]]:
    """Columns and one row per configuration: count plus mean and std of each metric over seeds."""
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        groups[run.configuration].append(run)
    tags = {tag for run in runs for tag in run.scalars}
    rotations = sorted((tag for tag in tags if rotation_angle(tag) is not None), key=rotation_angle)
    # the other named test sets (capsexp.results.metric_names): test/acc_affine_mnist, ...
    named_sets = sorted(tag for tag in tags if tag.startswith(f"{TEST_ACC}_") and rotation_angle(tag) is None)
    metrics = [tag for tag in (VAL_ACC_BEST, VAL_ACC, TEST_ACC) if tag in tags] + rotations + named_sets
    metrics += [tag for tag in (PRESENCE_GAP,) if tag in tags]
    rows = []
    for configuration, members in sorted(groups.items()):
        row: dict = {"configuration": configuration, "runs": len(members)}
        for metric in metrics:
            values = [v for v in (run.final(metric) for run in members) if v is not None]
            row[metric] = _mean_std(values) if values else None
        rows.append(row)
    return metrics, rows


def write_tables(metrics: list[str], rows: list[dict], shared: list[str], output: Path) -> None:
    def cell(metric: str, value) -> str:
        if value is None:
            return ""
        scale = 1 if metric == PRESENCE_GAP else 100  # accuracies in %
        mean, std = value
        return f"{scale * mean:.2f}" if std is None else f"{scale * mean:.2f} ± {scale * std:.2f}"

    header = ["configuration", "runs", *metrics]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(["---", "---:"] + ["---:"] * len(metrics)) + " |"]
    for row in rows:
        lines.append(
            "| " + " | ".join([row["configuration"], str(row["runs"])] + [cell(m, row[m]) for m in metrics]) + " |"
        )
    (output / "comparison.md").write_text(
        "# Run comparison\n\nAccuracies in %, mean ± std over the runs of each configuration (they differ only "
        "by seed; no std for a single run). Final values, except val/acc_best. "
        f"{PRESENCE_GAP}, where logged: the median over the validation images of the target class's score "
        "minus the largest other's, at the last validation (not in %).\n\n"
        + (f"Common to every run: `{' '.join(shared)}`\n\n" if shared else "")
        + "\n".join(lines)
        + "\n"
    )
    with open(output / "comparison.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["configuration", "runs"] + [f"{m} {s}" for m in metrics for s in ("mean", "std")])
        for row in rows:
            values = [math.nan if x is None else x for m in metrics for x in (row[m] or (None, None))]
            writer.writerow([row["configuration"], row["runs"], *values])


def write_plots(runs: list[Run], metrics: list[str], rows: list[dict], output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {row["configuration"]: f"C{i % 10}" for i, row in enumerate(rows)}

    def legend(axes) -> None:  # below the plot, long labels wrapped, so the axes keep their width
        handles, labels = axes.get_legend_handles_labels()
        axes.legend(
            handles,
            [textwrap.fill(label, 60) for label in labels],
            fontsize="small",
            loc="upper center",
            bbox_to_anchor=(0.5, -0.15),
        )

    figure, axes = plt.subplots(figsize=(8, 5))
    labelled = set()
    for run in runs:
        curve = run.scalars.get(VAL_ACC)
        if not curve:
            continue
        label = None if run.configuration in labelled else run.configuration
        labelled.add(run.configuration)
        axes.plot([s for s, _ in curve], [100 * v for _, v in curve], color=colours[run.configuration], label=label)
    if labelled:
        axes.set(xlabel="step", ylabel="validation accuracy (%)", title="Validation accuracy")
        legend(axes)
        figure.savefig(output / "val_acc.png", dpi=120, bbox_inches="tight")
    plt.close(figure)

    rotations = [m for m in metrics if rotation_angle(m) is not None]
    if rotations:
        angles = [rotation_angle(m) for m in rotations]
        figure, axes = plt.subplots(figsize=(8, 5))
        for row in rows:
            means = [100 * row[m][0] if row[m] else math.nan for m in rotations]
            errors = [100 * row[m][1] if row[m] and row[m][1] is not None else 0.0 for m in rotations]
            axes.errorbar(
                angles,
                means,
                yerr=errors,
                marker="o",
                capsize=3,
                color=colours[row["configuration"]],
                label=row["configuration"],
            )
        axes.set(
            xlabel="rotation of the test digits (degrees)", ylabel="test accuracy (%)", title="Accuracy versus rotation"
        )
        legend(axes)
        figure.savefig(output / "rotation.png", dpi=120, bbox_inches="tight")
        plt.close(figure)


def compare(folder: Path, output: Path | None = None) -> Path:
    """Write the comparison of every run under ``folder`` into ``output`` (default: ``folder``)."""
    output = output or folder
    runs = find_runs(folder)
    if not runs:
        raise NoRunsError(f"no runs under {folder} (a run is a folder with .hydra/overrides.yaml and tensorboard/)")
    output.mkdir(parents=True, exist_ok=True)
    shared = label_configurations(runs)
    metrics, rows = summarise(runs)
    write_tables(metrics, rows, shared, output)
    write_plots(runs, metrics, rows, output)
    return output
