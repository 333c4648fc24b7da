"""A comparison's figures. The first, ``differences.png``, shows the page's answer: each comparison the
page makes (its declared hypotheses first, with the smallest effect that matters) as the difference from
its reference with its 95% interval (:func:`forest_plot`). ``headline.png``: each configuration's
headline metric as a dot per run with the mean and its 95% confidence interval, sorted, the references
marked (:func:`interval_plot`, which the studies' sections use for their own figures too). Then the
validation accuracy over training (``val_acc.png``: a marker at every validation; with more than two
configurations one small panel each, the others in grey behind it, so that no curve hides another) and,
where rotated test sets were logged, the test accuracy against the angle (``rotation.png``: mean and
95% interval)."""

from __future__ import annotations

import math
import statistics
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from capsexp.overrides import left_side, written
from capsexp.records.metric_names import VAL_ACC, is_accuracy, rotation_angle
from capsexp.results import statistics as comparison_statistics

if TYPE_CHECKING:
    from capsexp.results.runs import Configuration, Run

DPI = 120
HEADLINE, CURVES, ROTATION, FOREST = "headline.png", "val_acc.png", "rotation.png", "differences.png"
OVERLAID_AT_MOST = 2  # learning curves of more configurations than this get a panel each
REFERENCE_LINES = ("--", ":")  # the first and the second reference's mean, as vertical lines
MIN_SPAN = 0.02  # an interval plot's axis spans at least this fraction of its values' size (2 points at 100%)
TITLE_WIDTH = 17  # characters of a figure's title per inch of its width (matplotlib's medium font)
TITLE_MOST = 150  # and at most this many: a longer line is hard to read


def display(label: str) -> str:
    """A configuration's label as a figure shows it: a study's arm by its name alone
    (``+arm/routing_engagement=dynamic`` -> ``dynamic``), each other override as it is."""
    return " ".join(written(part) if left_side(part).startswith("+arm/") else part for part in label.split())


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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


@dataclass(frozen=True)
class Row:
    """One configuration in an :func:`interval_plot`: its label and each run's value (display units);
    ``bounds``: the values' possible range, for proportions (accuracies: ``(0, 100)``)."""

    label: str
    values: list[float]
    reference: bool = False
    bounds: tuple[float, float] | None = None


def interval_plot(
    panels: Sequence[tuple[str, list[Row]]], path: Path, title: str, reference_order: Sequence[str] = ()
) -> Path:
    """Panels side by side, one per ``(axis label, rows)``, the configurations in the order of the first
    panel's means (best at the top): each run a dot, the mean a bar with its 95% interval
    (:func:`~capsexp.results.statistics.summarise`, within the rows' ``bounds``; a mean alone for one run)
    and their figures at the right, each reference's mean a vertical line (dashed for the first of
    ``reference_order``, dotted for the second). A panel of bounded rows does not reach past the bounds."""
    plt = _pyplot()
    order = [row.label for row in sorted(panels[0][1], key=lambda row: statistics.fmean(row.values))]
    height = 1.3 + 0.42 * len(order)
    figure, axes_list = plt.subplots(
        1, len(panels), figsize=(5.2 * len(panels) + 2.6, height), sharey=True, gridspec_kw={"wspace": 0.45}
    )
    axes_list = [axes_list] if len(panels) == 1 else list(axes_list)
    for axes, (xlabel, rows) in zip(axes_list, panels, strict=True):
        by_label = {row.label: row for row in rows}
        references = [row for row in rows if row.reference]
        for position, label in enumerate(order):
            row = by_label.get(label)
            if row is None or not row.values:
                continue
            summary = comparison_statistics.summarise(row.values, row.bounds)
            colour = "black" if row.reference else "C0"
            if summary.low is not None:
                axes.plot([summary.low, summary.high], [position, position], color=colour, linewidth=2.2)
            axes.plot(summary.mean, position, marker="|", markersize=16, markeredgewidth=2.5, color=colour)
            # Each run a dot, spread a little around the row so that equal values stay visible.
            offsets = [
                0.18 * (i - (len(row.values) - 1) / 2) / max(len(row.values) - 1, 1) for i in range(len(row.values))
            ]
            axes.scatter(row.values, [position + o for o in offsets], s=14, color="C1", zorder=3, linewidths=0)
            beside(
                axes,
                position,
                f"{summary.mean:.2f}"
                + (f" [{summary.low:.2f}, {summary.high:.2f}]" if summary.low is not None else ""),
            )
        references.sort(
            key=lambda row: (
                reference_order.index(row.label) if row.label in reference_order else len(reference_order),
                row.label,
            )
        )
        for reference, style in zip(references, REFERENCE_LINES, strict=False):
            mean = statistics.fmean(reference.values)
            axes.axvline(mean, color="grey", linestyle=style, linewidth=1)
        axes.set_xlabel(xlabel)
        axes.grid(axis="x", alpha=0.3)
        # Differences far below the runs' spread should not fill the axis: it spans MIN_SPAN of the values' size.
        values = [v for row in rows for v in row.values]
        low, high = min(values), max(values)
        if high - low < MIN_SPAN * max(abs(low), abs(high)):
            half = MIN_SPAN * max(abs(low), abs(high)) / 2
            axes.set_xlim((low + high) / 2 - half, (low + high) / 2 + half)
        _within(axes, "x", [row.bounds for row in rows])
    axes_list[0].set_yticks(range(len(order)))
    reference_labels = {row.label for _, rows in panels for row in rows if row.reference}
    axes_list[0].set_yticklabels(
        [
            textwrap.fill(
                display(label) + (" (reference)" if label in reference_labels else ""), 42, break_long_words=False
            )
            for label in order
        ],
        fontsize="small",
    )
    for tick, label in zip(axes_list[0].get_yticklabels(), order, strict=True):
        if label in reference_labels:
            tick.set_fontweight("bold")
    axes_list[0].set_ylim(-0.6, len(order) - 0.4)
    named = sorted(
        reference_labels,
        key=lambda label: (reference_order.index(label) if label in reference_order else len(reference_order), label),
    )
    if named:  # which line is which reference
        title += (
            " ("
            + ", ".join(f"{kind}: {display(label)}" for kind, label in zip(("dashed", "dotted"), named, strict=False))
            + ")"
        )
    return saved(figure, path, title)


def beside(axes, position: float, text: str) -> None:
    """``text`` at the right of the axes, level with the row at ``position``."""
    axes.annotate(
        text,
        xy=(1, position),
        xycoords=("axes fraction", "data"),
        xytext=(4, 0),
        textcoords="offset points",
        va="center",
        fontsize="x-small",
    )


def wrapped(title: str, figure) -> str:
    """``title`` broken at spaces to the figure's width (never inside a word)."""
    width = min(max(40, int(TITLE_WIDTH * figure.get_size_inches()[0])), TITLE_MOST)
    return textwrap.fill(title, width, break_long_words=False, break_on_hyphens=False)


def saved(figure, path: Path, title: str) -> Path:
    """``figure`` under its ``title`` (wrapped to its width), written to ``path`` at the pages' resolution,
    and closed."""
    figure.suptitle(wrapped(title, figure), fontsize="medium")
    figure.savefig(path, dpi=DPI, bbox_inches="tight")
    _pyplot().close(figure)
    return path


def interval_title(runs_per_row: Sequence[int], references: bool = True, bounded: Sequence[bool] = ()) -> str:
    """What an interval plot's marks are, for runs_per_row runs in each configuration (and lines of the
    references' means where there are ``references``); ``bounded``: whether each panel's values are
    accuracies (proportions: their intervals stay within 0-100 %)."""
    if max(runs_per_row, default=1) < 2:
        return "one run per configuration (a dot each; no interval)"
    lines = "; vertical lines: the references' means" if references else ""
    method = "Student's t"
    if bounded and all(bounded):
        method = comparison_statistics.BOUNDED_INTERVAL
    elif any(bounded):
        method = f"accuracies: {comparison_statistics.BOUNDED_INTERVAL}; other scores: Student's t"
    confidence = f"{100 * comparison_statistics.CONFIDENCE:.0f}%"
    return f"dots: runs; bar: mean; line: its {confidence} confidence interval ({method}){lines}"


def _within(axes, axis: str, bounds: Sequence[tuple[float, float] | None]) -> None:
    """The ``axis`` ("x" or "y") of ``axes`` cut to the values' possible range where every row has one
    (matplotlib's margins would reach past 100 %)."""
    if not bounds or any(b is None for b in bounds):
        return
    get, set_ = (axes.get_xlim, axes.set_xlim) if axis == "x" else (axes.get_ylim, axes.set_ylim)
    low, high = get()
    set_(max(low, min(b[0] for b in bounds)), min(high, max(b[1] for b in bounds)))


def mean_curve(runs: list[Run], tag: str) -> tuple[list[int], list[float], list[float]]:
    """Steps every run of ``runs`` logged ``tag`` at, with the mean and the std (0 for one run) there."""
    curves = [dict(run.scalars[tag]) for run in runs if run.scalars.get(tag)]
    if not curves:
        return [], [], []
    steps = sorted(set.intersection(*(set(curve) for curve in curves)))
    means = [statistics.fmean(curve[step] for curve in curves) for step in steps]
    stds = [statistics.stdev(curve[step] for curve in curves) if len(curves) > 1 else 0.0 for step in steps]
    return steps, means, stds


def _curves(configurations: list[Configuration], output: Path) -> Path | None:
    """``val_acc.png``: the mean validation accuracy of each configuration at each validation (a marker
    each), a ± std band where it has several runs."""
    curves = []
    for configuration in configurations:
        steps, means, stds = mean_curve(configuration.runs, VAL_ACC)
        if steps:
            runs = sum(1 for run in configuration.runs if run.scalars.get(VAL_ACC))
            curves.append(
                (display(configuration.label), runs, steps, [100 * m for m in means], [100 * s for s in stds])
            )
    if not curves:
        return None
    plt = _pyplot()
    several = max(runs for _, runs, *_ in curves) > 1
    what = "mean over seeds, band ± one std" if several else "one run each"
    title = f"Validation accuracy at each validation ({what})"
    if len(curves) <= OVERLAID_AT_MOST:
        figure, axes = plt.subplots(figsize=(8, 5))
        for i, (label, runs, steps, means, stds) in enumerate(curves):
            colour, marker, style = f"C{i}", "os"[i % 2], ("-", "--")[i % 2]
            axes.plot(
                steps,
                means,
                color=colour,
                marker=marker,
                markersize=4,
                linestyle=style,
                label=f"{label} ({runs} run{'s' if runs > 1 else ''})",
            )
            if runs > 1:
                axes.fill_between(
                    steps,
                    [m - s for m, s in zip(means, stds, strict=True)],
                    [m + s for m, s in zip(means, stds, strict=True)],
                    color=colour,
                    alpha=0.2,
                    linewidth=0,
                )
        axes.set(xlabel="step", ylabel="validation accuracy (%)")
        axes.set_title(wrapped(title, figure))
        _legend(axes)
    else:
        columns = 3
        rows = math.ceil(len(curves) / columns)
        figure, grid = plt.subplots(
            rows,
            columns,
            figsize=(3.6 * columns, 2.7 * rows + 0.6),
            sharex=True,
            sharey=True,
            squeeze=False,
            layout="constrained",  # room for the title above the panels' own
        )
        for index, (label, runs, steps, means, stds) in enumerate(curves):
            axes = grid[index // columns][index % columns]
            for other in curves:
                if other[0] != label:
                    axes.plot(other[2], other[3], color="0.8", linewidth=0.8)
            axes.plot(steps, means, color="C0", marker="o", markersize=3)
            if runs > 1:
                axes.fill_between(
                    steps,
                    [m - s for m, s in zip(means, stds, strict=True)],
                    [m + s for m, s in zip(means, stds, strict=True)],
                    color="C0",
                    alpha=0.25,
                    linewidth=0,
                )
            axes.set_title(textwrap.fill(f"{label} ({runs} run{'s' if runs > 1 else ''})", 38), fontsize="small")
            axes.grid(alpha=0.3)
        for index in range(len(curves), rows * columns):
            grid[index // columns][index % columns].set_visible(False)
        for axes in grid[-1]:
            axes.set_xlabel("step")
        for axes in grid[:, 0]:
            axes.set_ylabel("validation accuracy (%)")
        figure.suptitle(wrapped(title + "; the other configurations in grey", figure), fontsize="medium")
    figure.savefig(output / CURVES, dpi=DPI, bbox_inches="tight")
    plt.close(figure)
    return output / CURVES


def _rotation(configurations: list[Configuration], metrics: list[str], output: Path) -> Path | None:
    """``rotation.png``: each configuration's test accuracy against the rotation, mean with its 95% interval."""
    rotations = [m for m in metrics if rotation_angle(m) is not None]
    if not rotations:
        return None
    plt = _pyplot()
    angles = [rotation_angle(m) for m in rotations]
    figure, axes = plt.subplots(figsize=(8, 5))
    several = False
    for i, configuration in enumerate(configurations):
        summaries = [configuration.summary(m) for m in rotations]
        several |= any(s is not None and s.low is not None for s in summaries)
        errors = [
            [100 * (s.mean - s.low) if s and s.low is not None else 0.0 for s in summaries],
            [100 * (s.high - s.mean) if s and s.low is not None else 0.0 for s in summaries],
        ]
        axes.errorbar(
            angles,
            [100 * s.mean if s else math.nan for s in summaries],
            yerr=errors,
            marker="os^v"[i % 4],
            linestyle=("-", "--", "-.", ":")[i % 4],
            capsize=3,
            color=f"C{i % 10}",
            label=display(configuration.label),
        )
    bars = (
        f"mean and its {100 * comparison_statistics.CONFIDENCE:.0f}% confidence interval over seeds, "
        f"{comparison_statistics.BOUNDED_INTERVAL}"
        if several
        else "one run each"
    )
    axes.set(xlabel="rotation of the test digits (degrees)", ylabel="test accuracy (%)")
    _within(axes, "y", [(0.0, 100.0)])
    axes.set_title(wrapped(f"Accuracy versus rotation ({bars})", figure))
    _legend(axes)
    figure.savefig(output / ROTATION, dpi=DPI, bbox_inches="tight")
    plt.close(figure)
    return output / ROTATION


def headline_rows(configurations: list[Configuration], metric: str, factor: float, references: list[str]) -> list[Row]:
    """Each configuration's runs' final ``metric`` (times ``factor``) as an :class:`Row`."""
    bounds = (0.0, factor) if is_accuracy(metric) else None
    return [
        Row(c.label, [factor * value for _, value in c.values(metric)], c.label in references, bounds)
        for c in configurations
        if c.values(metric)
    ]


def write_plots(
    configurations: list[Configuration],
    metrics: list[str],
    output: Path,
    headline: list[tuple[str, list[Row]]],
    references: Sequence[str] = (),
) -> list[Path]:
    """Write ``headline.png`` (from ``headline``: an axis label and rows per compared metric; ``references``
    in the page's order), ``val_acc.png``
    and (with rotated test sets) ``rotation.png`` into ``output``; return those written, the headline first."""
    written = []
    if headline and headline[0][1]:
        bounded = [all(row.bounds is not None for row in rows) for _, rows in headline]
        title = (
            f"{', '.join(label for label, _ in headline)}: "
            f"{interval_title([len(r.values) for r in headline[0][1]], bool(references), bounded)}"
        )
        written.append(interval_plot(headline, output / HEADLINE, title))
    written += [path for path in (_curves(configurations, output), _rotation(configurations, metrics, output)) if path]
    return written


@dataclass(frozen=True)
class ForestRow:
    """One comparison in a :func:`forest_plot`: ``label`` (the arm minus its reference) in ``panel`` (its
    metric's axis label), the mean difference and its 95% interval (None: one run a side), and for a
    declared hypothesis its smallest effect that matters."""

    label: str
    panel: str
    mean: float
    low: float | None
    high: float | None
    smallest_effect: float | None = None
    declared: bool = False
    significant: bool = False  # by the page's family of tests
    places: int = 2  # decimals of the figures beside the row
    margin: float | None = None  # a declared hypothesis's equivalence margin: its interval within +-margin
    not_judged: bool = False  # a declared hypothesis the runs cannot answer (its page says why)
    # false for a comparison with a net that did not learn, whose difference is that: drawn at the axis's
    # edge with its value, so that it does not flatten every other row
    sets_axis: bool = True
    equivalent: bool = False  # a declared hypothesis shown equivalent within its margin: a green square


def forest_plot(rows: Sequence[ForestRow], path: Path, title: str) -> Path:
    """Each comparison's difference from its reference with its 95% interval, a panel per metric: the
    declared hypotheses first (blue, their smallest effect that matters as a shaded band about 0, their
    equivalence margin, where declared, as dashed red ticks), the other comparisons after (grey); a filled
    dot where the page's family of tests calls it significant, a green square where its two one-sided tests
    show it equivalent; a declared hypothesis not judged grey, its label so marked. Differences without an
    interval (one run a side) do not set the axis: they are drawn as open diamonds, at the axis's edge with
    their value where they fall beyond it; nor do the rows that are not to (``sets_axis``), drawn there as
    crosses."""
    plt = _pyplot()
    panels = list(dict.fromkeys(row.panel for row in rows))
    by_panel = {panel: [row for row in rows if row.panel == panel] for panel in panels}
    height = 1.4 + 0.36 * max(len(found) for found in by_panel.values())
    figure, axes_list = plt.subplots(
        1, len(panels), figsize=(6.4 * len(panels) + 1.5, height), squeeze=False, layout="constrained"
    )
    for axes, panel in zip(axes_list[0], panels, strict=True):
        found = by_panel[panel]
        positions = list(range(len(found)))[::-1]  # the first row at the top
        setting = [row for row in found if row.sets_axis]
        bounded = [x for row in setting if row.low is not None for x in (row.low, row.high)]
        bounded += [s for row in setting if row.smallest_effect for s in (row.smallest_effect, -row.smallest_effect)]
        bounded += [s for row in setting if row.margin for s in (row.margin, -row.margin)]
        bounded = bounded or [row.mean for row in setting or found]
        low, high = min([*bounded, 0.0]), max([*bounded, 0.0])
        margin = 0.08 * (high - low or 1.0)
        low, high = low - margin, high + margin
        axes.axvline(0, color="black", linewidth=0.8)
        for position, row in zip(positions, found, strict=True):
            colour = "C0" if row.declared and not row.not_judged else "C7"
            if row.smallest_effect:
                axes.fill_betweenx(
                    [position - 0.4, position + 0.4], -row.smallest_effect, row.smallest_effect, color="C2", alpha=0.15
                )
            if row.margin:  # the equivalence margin: an interval inside both ticks shows no difference
                for edge in (-row.margin, row.margin):
                    axes.plot([edge, edge], [position - 0.35, position + 0.35], color="C3", linewidth=1.2, ls="--")
            if not row.sets_axis:  # at the edge, its figures beside it as every row's
                shown = min(max(row.mean, low), high)
                axes.plot(shown, position, marker="X", markersize=7, color=colour, clip_on=False)
                interval = "" if row.low is None else f" [{row.low:+.{row.places}f}, {row.high:+.{row.places}f}]"
                beside(axes, position, f"{row.mean:+.{row.places}f}{interval}")
                continue
            if row.low is None:
                shown = min(max(row.mean, low), high)
                axes.plot(shown, position, marker="D", markersize=6, markerfacecolor="none", color=colour)
                if shown != row.mean:
                    axes.annotate(
                        f"{row.mean:+.2f}",
                        xy=(shown, position),
                        xytext=(0, 6),
                        textcoords="offset points",
                        ha="center",
                        fontsize="x-small",
                        color=colour,
                    )
                continue
            axes.plot([row.low, row.high], [position, position], color=colour, linewidth=2)
            # the figures, since a panel's scale is set by its largest difference
            places = row.places
            beside(axes, position, f"{row.mean:+.{places}f} [{row.low:+.{places}f}, {row.high:+.{places}f}]")
            axes.plot(
                row.mean,
                position,
                marker="s" if row.equivalent else "o",
                markersize=6,
                color="C2" if row.equivalent else colour,
                markerfacecolor=colour if row.significant else "C2" if row.equivalent else "white",
            )
        axes.set_xlim(low, high)
        axes.set_yticks(positions)
        labels = [row.label + (" (not judged)" if row.not_judged else "") for row in found]
        axes.set_yticklabels([textwrap.fill(label, 36, break_long_words=False) for label in labels], fontsize="small")
        for tick, row in zip(axes.get_yticklabels(), found, strict=True):
            tick.set_fontweight("bold" if row.declared and not row.not_judged else "normal")
        axes.set_xlabel(panel)
        axes.grid(axis="x", alpha=0.3)
        axes.set_ylim(-0.6, len(found) - 0.4)
    return saved(figure, path, title)
