"""The routing engagement study's first figure: how far each configuration's couplings are from uniform over
training, read from the measures :class:`~capsexp.callbacks.routing_diagnostics.RoutingDiagnostics` logs
(:func:`~capsexp.nn.functional.routing_engagement`), with the seeds' spread."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from capsexp.callbacks.routing_diagnostics import ENGAGEMENT
from capsexp.results import statistics
from capsexp.results.plots import _pyplot, display, saved
from capsexp.results.runs import Configuration, Run, group
from capsexp.results.study import StudyPage

FIGURE = "engagement.png"
# The panels: routing_engagement's measures, with their axis labels; the KL on a log axis (it spans
# uniform's 0 to hard assignments' log P), drawn from KL_FLOOR up.
PANELS = {
    ENGAGEMENT["kl_from_uniform"]: "KL divergence from uniform (nats, log axis)",
    ENGAGEMENT["largest"]: "mean largest coupling",
    ENGAGEMENT["decided"]: "share of children with a coupling over 2/J",
}
KL_FLOOR = 1e-6


def routing_layers_logged(runs: list[Run]) -> list[str]:
    """The routing layers whose engagement the runs logged, in the order first seen."""
    pattern = re.compile(rf"routing/(.+)/{ENGAGEMENT['kl_from_uniform']}$")
    return list(dict.fromkeys(m.group(1) for run in runs for tag in run.scalars if (m := pattern.match(tag))))


def curve(configuration: Configuration, tag: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """Steps and the mean, least and largest value over the configuration's runs at each step that all the
    runs logged; None where none did."""
    series = [{s.step: s.value for s in run.scalars[tag]} for run in configuration.runs if run.scalars.get(tag)]
    if not series:
        return None
    steps = sorted(set.intersection(*(set(s) for s in series)))
    values = np.array([[s[step] for step in steps] for s in series])
    return np.array(steps), values.mean(axis=0), values.min(axis=0), values.max(axis=0)


STYLES = ("-", "--", "-.", ":")  # with a marker each, so that equal curves stay told apart
MARKERS = "os^vDP<>"
TEST_SHARE = "test_predicted_share"  # the share of a child's vote sent to the predicted class, at test


def engagement_figure(runs: list[Run], page: StudyPage, output: Path) -> Path | None:
    """``engagement.png``: per routing layer, each measure over training (a column each) and the test-time
    share to the predicted class (the last column: a dot per seed, a bar at the mean), the configurations
    of several seeds in one row (the mean over the seeds, the band between their least and largest value)
    and those of one seed in a row of their own, so that neither sets the other's scale. Each
    configuration has its own line style and marker, drawn at offset steps, so that equal curves (uniform
    coupling in two nets) both show. None when no run logged the measures."""
    layers = routing_layers_logged(runs)
    if not layers:
        return None
    plt = _pyplot()
    configurations = group(runs)
    groups = [
        [c for c in configurations if len(c.runs) > 1],
        [c for c in configurations if len(c.runs) == 1],
    ]
    groups = [found for found in groups if found]
    rows = [(layer, found) for layer in layers for found in groups]
    columns = len(PANELS) + 1
    figure, axes_grid = plt.subplots(
        len(rows), columns, figsize=(4.6 * columns, 3.5 * len(rows) + 1.0), squeeze=False, layout="constrained"
    )
    style_of = {c.label: i for i, c in enumerate(configurations)}
    for axes_row, (layer, found) in zip(axes_grid, rows, strict=True):
        seeds = "one seed each" if len(found[0].runs) == 1 else "several seeds each (mean; band: range)"
        for axes, (measure, label) in zip(axes_row, PANELS.items(), strict=False):
            for configuration in found:
                curve_found = curve(configuration, f"routing/{layer}/{measure}")
                if curve_found is None:
                    continue
                steps, mean, low, high = curve_found
                if measure == ENGAGEMENT["kl_from_uniform"]:
                    mean, low, high = (np.maximum(x, KL_FLOOR) for x in (mean, low, high))
                index = style_of[configuration.label]
                colour = colour_of(index)
                axes.plot(
                    steps,
                    mean,
                    STYLES[index % len(STYLES)],
                    color=colour,
                    linewidth=1.4,
                    marker=MARKERS[index % len(MARKERS)],
                    markersize=4,
                    markevery=(index % 8, 8),
                    label=display(configuration.label),
                )
                if len(configuration.runs) > 1:
                    axes.fill_between(steps, low, high, color=colour, alpha=0.2, linewidth=0)
            if measure == ENGAGEMENT["kl_from_uniform"]:
                axes.set_yscale("log")
                axes.set_ylim(bottom=KL_FLOOR)
            elif measure == ENGAGEMENT["decided"]:
                axes.set_ylim(bottom=0)
            axes.set_xlabel("training step")
            axes.set_title(f"{layer}: {label}\n({seeds})", fontsize="small")
            axes.grid(alpha=0.3)
        _test_share(axes_row[-1], layer, found, style_of)
        axes_row[len(PANELS) // 2].legend(
            fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=min(4, len(found))
        )
    title = (
        "How far the couplings are from uniform, over training and at test (KL below "
        f"{KL_FLOOR:g} drawn at {KL_FLOOR:g}; uniform coupling's largest coupling and share are 1/J)"
    )
    return saved(figure, output / FIGURE, title)


def colour_of(index: int):
    """A configuration's colour: matplotlib's ten, then tab20's light ones, so that up to 20 differ."""
    from matplotlib import colormaps

    return f"C{index}" if index < 10 else colormaps["tab20"](2 * (index - 10) % 20 + 1)


def _test_share(axes, layer: str, found: list[Configuration], style_of: dict[str, int]) -> None:
    """The share of a child's vote to the predicted class at test: a dot per run, a bar at the mean."""
    tag = f"routing/{layer}/{TEST_SHARE}"
    shown = [(c, [v for run in c.runs if (v := run.final(tag)) is not None]) for c in found]
    shown = [(c, values) for c, values in shown if values]
    for position, (configuration, values) in enumerate(shown):
        colour = colour_of(style_of[configuration.label])
        axes.scatter(values, [position] * len(values), s=16, color=colour, zorder=3)
        axes.plot(np.mean(values), position, marker="|", markersize=14, markeredgewidth=2.5, color=colour)
    axes.set_yticks(range(len(shown)))
    axes.set_yticklabels([display(c.label) for c, _ in shown], fontsize="x-small")
    axes.set_ylim(-0.6, len(shown) - 0.4)
    axes.set_xlabel("share of a child's vote")
    axes.set_title(f"{layer}: to the predicted class, at test\n(a dot per seed, bar: mean)", fontsize="small")
    axes.grid(axis="x", alpha=0.3)


def figures(runs: list[Run], page: StudyPage) -> dict:
    """The figures the page's notes quote beyond the tables' (:mod:`capsexp.results.claims`):
    ``scalar_difference(tag, key, reference)``, ``key`` minus ``reference`` in the last logged value of any
    scalar (an engagement measure), as logged, paired by seed (:func:`capsexp.results.statistics.difference`)
    and not adjusted for other comparisons: a Gap whose ``points`` are in the scalar's units."""
    from capsexp.results.claims import Gap, MissingFigure

    configurations = {c.label: c for c in group(runs)}

    def scalar_difference(tag: str, key: str, reference: str) -> Gap:
        if key not in configurations or reference not in configurations:
            raise MissingFigure(f"no configuration {key!r} or {reference!r} among these runs")
        sides = [
            [(run.seed, value) for run in configurations[label].runs if (value := run.final(tag)) is not None]
            for label in (key, reference)
        ]
        if not all(sides):
            raise MissingFigure(f"{tag} not logged by both {key!r} and {reference!r}")
        found = statistics.difference(*sides)
        # An effect size with its interval, never a test: a measure constant by construction in one arm
        # (uniform coupling's KL from uniform is 0) makes a test of the pair show only that the other is not.
        return Gap(found.mean, found.low, found.high, None, False, found.tested, places=4)  # KL: ten-thousandths

    return {"scalar_difference": scalar_difference}
