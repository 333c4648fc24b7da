"""The routing engagement study's first figure: how far each configuration's couplings are from uniform over
training, read from the measures :class:`~capsexp.callbacks.routing_diagnostics.RoutingDiagnostics` logs
(:func:`~capsexp.nn.functional.routing_engagement`), with the seeds' spread."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from capsexp.callbacks.routing_diagnostics import ENGAGEMENT
from capsexp.results import statistics
from capsexp.results.plots import _legend, _pyplot, saved
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


def engagement_figure(runs: list[Run], page: StudyPage, output: Path) -> Path | None:
    """``engagement.png``: per routing layer (a row) and measure (a column), each configuration's mean over
    its seeds against the training step, the band between its seeds' least and largest value; None when no
    run logged the measures."""
    layers = routing_layers_logged(runs)
    if not layers:
        return None
    plt = _pyplot()
    configurations = group(runs)
    figure, axes_grid = plt.subplots(
        len(layers), len(PANELS), figsize=(5.0 * len(PANELS), 3.6 * len(layers) + 1.2), squeeze=False
    )
    seeds = max(len(c.runs) for c in configurations)
    for row, layer in zip(axes_grid, layers, strict=True):
        for axes, (measure, label) in zip(row, PANELS.items(), strict=True):
            for index, configuration in enumerate(configurations):
                found = curve(configuration, f"routing/{layer}/{measure}")
                if found is None:
                    continue
                steps, mean, low, high = found
                if measure == ENGAGEMENT["kl_from_uniform"]:
                    mean, low, high = (np.maximum(x, KL_FLOOR) for x in (mean, low, high))
                colour = f"C{index % 10}"
                style = "-" if len(configuration.runs) > 1 else "--"
                axes.plot(steps, mean, style, color=colour, linewidth=1.4, label=configuration.label)
                if len(configuration.runs) > 1:
                    axes.fill_between(steps, low, high, color=colour, alpha=0.2, linewidth=0)
            if measure == ENGAGEMENT["kl_from_uniform"]:
                axes.set_yscale("log")
                axes.set_ylim(bottom=KL_FLOOR)
            elif measure == ENGAGEMENT["decided"]:
                axes.set_ylim(bottom=0)
            axes.set_xlabel("training step")
            axes.set_title(f"{layer}: {label}", fontsize="medium")
            axes.grid(alpha=0.3)
    _legend(axes_grid[-1][len(PANELS) // 2])
    spread = f"line: the mean of {seeds} seeds, band: their range; dashed: one seed" if seeds > 1 else "one seed each"
    title = (
        f"How far the couplings are from uniform over training ({spread}; KL below {KL_FLOOR:g} drawn at "
        f"{KL_FLOOR:g}; uniform coupling's largest coupling is 1/J)"
    )
    return saved(figure, output / FIGURE, title)


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
        return Gap(found.mean, found.low, found.high, None, False, found.tested)

    return {"scalar_difference": scalar_difference}
