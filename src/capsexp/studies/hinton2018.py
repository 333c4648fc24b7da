"""Sections of the pages of the EM-capsule studies, after Hinton, Sabour and Frosst (2018), "Matrix capsules
with EM routing"."""

from __future__ import annotations

import statistics
from pathlib import Path

from capsexp.records.metric_names import PRESENCE_GAP
from capsexp.results.runs import Run, group
from capsexp.results.study import StudyPage

MARGIN = "train/margin"  # the spread loss's margin, logged by capsexp.lit.margin


def presence_as_the_margin_rises(runs: list[Run], page: StudyPage, output: Path) -> str:
    """Per configuration and validation: the median presence gap (mean over its runs) beside the margin
    the spread loss asked for then (``train/margin`` at the last step logged before the validation).
    The loss asks for a gap of at least the margin: a gap that stays below it is the loss not met."""
    lines: list[str] = []
    for configuration in group(runs):
        gaps: dict[int, list[float]] = {}
        margins: dict[int, float] = {}
        for run in configuration.runs:
            margin_curve = run.scalars.get(MARGIN, [])
            for step, gap in run.scalars.get(PRESENCE_GAP, []):
                gaps.setdefault(step + 1, []).append(gap)  # a validation after step N is logged at N - 1
                earlier = [value for logged, value in margin_curve if logged <= step]
                if earlier:
                    margins[step + 1] = earlier[-1]
        steps = [step for step in sorted(gaps) if len(gaps[step]) == len(configuration.runs)]
        if not steps:
            continue
        if not lines:
            lines = [
                "| configuration | " + " | ".join(f"step {s}" for s in steps) + " |",
                "| --- |" + " ---: |" * len(steps),
            ]
        cells = [f"{statistics.fmean(gaps[s]):.2f}" + (f" ({margins[s]:.2f})" if s in margins else "") for s in steps]
        lines.append(f"| {configuration.label} | " + " | ".join(cells) + " |")
    if not lines:
        return ""
    return (
        "## Presence gap as the margin rises\n\n"
        "At each validation: the median presence gap over the validation images (mean over the runs) and, in "
        f"brackets, the spread loss's margin at that step (`{MARGIN}`). The loss asks for a gap of at least the "
        "margin; a gap above it costs nothing.\n\n" + "\n".join(lines) + "\n"
    )
