"""A comparison's figures: the validation accuracy of each configuration over training (the mean over
its runs, with a band of ± one standard deviation where it has several), and, where rotated test sets
were logged, the test accuracy against the angle (mean with the seeds' std as error bars)."""

from __future__ import annotations

import math
import statistics
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

from capsexp.results.metric_names import VAL_ACC, rotation_angle

if TYPE_CHECKING:
    from capsexp.results.runs import Configuration, Run

DPI = 120


def _legend(axes) -> None:
    """Below the plot, long labels wrapped, so that the axes keep their width."""
    handles, labels = axes.get_legend_handles_labels()
    axes.legend(
        handles,
        [textwrap.fill(label, 60) for label in labels],
        fontsize="small",
        loc="upper center",
        bbox_to_anchor=(0.5, -0.15),
    )


def mean_curve(runs: list[Run], tag: str) -> tuple[list[int], list[float], list[float]]:
    """Steps every run of ``runs`` logged ``tag`` at, with the mean and the std (0 for one run) there."""
    curves = [dict(run.scalars[tag]) for run in runs if run.scalars.get(tag)]
    if not curves:
        return [], [], []
    steps = sorted(set.intersection(*(set(curve) for curve in curves)))
    means = [statistics.fmean(curve[step] for curve in curves) for step in steps]
    stds = [statistics.stdev(curve[step] for curve in curves) if len(curves) > 1 else 0.0 for step in steps]
    return steps, means, stds


def write_plots(runs: list[Run], configurations: list[Configuration], metrics: list[str], output: Path) -> list[Path]:
    """Write ``val_acc.png`` and (with rotated test sets) ``rotation.png`` into ``output``; return them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    colours = {c.label: f"C{i % 10}" for i, c in enumerate(configurations)}
    figure, axes = plt.subplots(figsize=(8, 5))
    drawn = False
    for configuration in configurations:
        steps, means, stds = mean_curve(configuration.runs, VAL_ACC)
        if not steps:
            continue
        drawn = True
        colour = colours[configuration.label]
        runs_with_curve = sum(1 for run in configuration.runs if run.scalars.get(VAL_ACC))
        label = f"{configuration.label} ({runs_with_curve} run{'s' if runs_with_curve > 1 else ''})"
        axes.plot(steps, [100 * m for m in means], color=colour, label=label)
        if runs_with_curve > 1:
            axes.fill_between(
                steps,
                [100 * (m - s) for m, s in zip(means, stds, strict=True)],
                [100 * (m + s) for m, s in zip(means, stds, strict=True)],
                color=colour,
                alpha=0.2,
                linewidth=0,
            )
    if drawn:
        axes.set(xlabel="step", ylabel="validation accuracy (%)", title="Validation accuracy: mean over seeds ± std")
        _legend(axes)
        figure.savefig(output / "val_acc.png", dpi=DPI, bbox_inches="tight")
        written.append(output / "val_acc.png")
    plt.close(figure)

    rotations = [m for m in metrics if rotation_angle(m) is not None]
    if rotations:
        angles = [rotation_angle(m) for m in rotations]
        figure, axes = plt.subplots(figsize=(8, 5))
        for configuration in configurations:
            summaries = [configuration.summary(m) for m in rotations]
            axes.errorbar(
                angles,
                [100 * s.mean if s else math.nan for s in summaries],
                yerr=[100 * s.std if s and s.std is not None else 0.0 for s in summaries],
                marker="o",
                capsize=3,
                color=colours[configuration.label],
                label=configuration.label,
            )
        axes.set(
            xlabel="rotation of the test digits (degrees)", ylabel="test accuracy (%)", title="Accuracy versus rotation"
        )
        _legend(axes)
        figure.savefig(output / "rotation.png", dpi=DPI, bbox_inches="tight")
        written.append(output / "rotation.png")
        plt.close(figure)
    return written
