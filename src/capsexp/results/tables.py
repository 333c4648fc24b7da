"""The tables of a results page: the configurations' results, each configuration against the references,
the declared hypotheses (Markdown), and ``comparison.csv``. Their cells only: the sentences around them
are :mod:`capsexp.results.prose`'s."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from capsexp.results import statistics
from capsexp.results.claims import p_text
from capsexp.results.differences import (
    Compared,
    both_adjusted,
    family,
    permutation_adjusted,
    places,
    scale,
    test_only,
    verdict,
)
from capsexp.results.runs import Configuration
from capsexp.results.study import StudyPage, figure_for

TABLE = "comparison.csv"


def mean_std(summary: statistics.Summary | None, factor: float) -> str:
    return summary.text(factor) if summary else ""


def interval(low: float | None, high: float | None, factor: float) -> str:
    shown = places(factor)
    return "" if low is None else f"[{factor * low:.{shown}f}, {factor * high:.{shown}f}]"


def results_table(configurations: list[Configuration], metrics: list[str], headline: str, page: StudyPage) -> str:
    factor = scale(headline)
    header = ["configuration", "runs", f"{headline} (95% CI)"]
    header += [m for m in metrics if m != headline]
    paper = page.paper
    if paper:
        header += ([f"{headline} as error (%)"] if paper.error else []) + [f"paper: {paper.metric}"]
    lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
    for configuration in configurations:
        summary = configuration.summary(headline)
        cells = [configuration.label, str(len(configuration.runs))]
        cells.append(
            f"{mean_std(summary, factor)} {interval(summary.low, summary.high, factor)}".strip() if summary else ""
        )
        cells += [mean_std(configuration.summary(m), scale(m)) for m in metrics if m != headline]
        if paper:
            overrides = configuration.runs[0].overrides
            if paper.error:
                cells.append(f"{100 - 100 * summary.mean:.2f}" if summary else "")
            cells.append(str(figure_for(paper.figures, overrides) or ""))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def compared_rows(configurations: list[Configuration], metrics: list[str], page: StudyPage) -> list[Compared]:
    """The page's comparisons (:func:`~capsexp.results.differences.family`) of the configurations that
    are compared (test-only ones, :func:`test_only`, are not), once for its table and its figure; none
    where it compares nothing."""
    in_comparison = [c for c in configurations if not test_only(c)]
    if len(in_comparison) < 2 or not (page.differences or page.hypotheses):
        return []
    return family(in_comparison, metrics, page)


def against_table(rows: list[Compared], metrics: list[str], several: bool, tests: bool) -> list[str]:
    """Each configuration minus each reference (``several``: more than one, a column of its own), metric
    by metric (a column where there are several), with its interval and, where the table ``tests``, both
    tests' p-values adjusted over the table's family."""
    header = (
        ["metric"] * (len(metrics) > 1) + ["reference"] * several + ["configuration", "runs", "difference", "95% CI"]
    )
    if tests:
        header += ["detectable", "p, t-test (Holm)", "p, permutation (Holm)", "significant"]
    lines = ["| " + " | ".join(header) + " |"]
    lines.append(
        "| "
        + " | ".join(
            "---" if name in ("metric", "reference", "configuration", "significant") else "---:" for name in header
        )
        + " |"
    )
    permuted = permutation_adjusted(rows)
    for row, permuted_p in zip(rows, permuted, strict=True):
        factor = scale(row.metric)
        cells = [row.metric] * (len(metrics) > 1) + [row.reference.label] * several + [row.configuration.label]
        found = row.difference
        if found is None:
            cells += [str(len(row.configuration.runs)), "not logged by both", ""]
        else:
            cells += [
                f"{found.runs[0]} / {found.runs[1]}",
                f"{factor * found.mean:+.{places(factor)}f}",
                interval(found.low, found.high, factor),
            ]
        if tests:
            if found is None:
                cells += ["", "", "", ""]
            elif not found.tested:
                cells += ["", "", "", "too few seeds to test" if found.too_few_to_test else ""]
            else:
                significant = "" if math.isnan(row.p_holm) else ("yes" if row.significant else "no")
                cells += [
                    f"{factor * found.detectable:.{places(factor)}f}",
                    p_text(row.p_holm),
                    p_text(permuted_p),
                    significant,
                ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def hypotheses_table(rows: list[Compared], page: StudyPage) -> list[str]:
    """The declared hypotheses (``rows``: those the runs test), each with both tests (each adjusted by Holm
    over the hypotheses) and whether the runs support it by its declared test; ``not run`` where they lack
    an arm."""
    adjusted = both_adjusted(rows)
    lines = [
        "| hypothesis | metric | arm − reference | direction | runs | difference | 95% CI | smallest effect "
        "| detectable (observed spread) | p, t-test (Holm) | p, permutation (Holm) | test | verdict |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    declared = {id(row.hypothesis): row for row in rows}
    for hypothesis in page.hypotheses:
        row = declared.get(id(hypothesis))
        names = f"{hypothesis.arm.split('=')[-1]} − {hypothesis.reference.split('=')[-1]}"
        first = f"| {hypothesis.name} | {hypothesis.metric} | {names} | {hypothesis.direction} |"
        if row is None or row.difference is None:
            lines.append(f"{first} | | | {hypothesis.smallest_effect:g} | | | | {hypothesis.test} | not run |")
            continue
        found, factor = row.difference, scale(hypothesis.metric)
        t, permuted = adjusted[id(row)] if found.tested else (None, None)
        lines.append(
            f"{first} {found.runs[0]} / {found.runs[1]} | {factor * found.mean:+.{places(factor)}f} | "
            f"{interval(found.low, found.high, factor)} | {hypothesis.smallest_effect:g} | "
            f"{'' if found.detectable is None else f'{factor * found.detectable:.{places(factor)}f}'} | {p_text(t)} | "
            f"{p_text(permuted)} | {hypothesis.test} | {verdict(row, adjusted[id(row)][1], bool(page.exploratory))} |"
        )
    return lines


def write_csv(configurations: list[Configuration], metrics: list[str], output: Path) -> None:
    with open(output / TABLE, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["configuration", "runs"] + [f"{m} {s}" for m in metrics for s in ("mean", "std", "ci_low", "ci_high")]
        )
        for configuration in configurations:
            row: list = [configuration.label, len(configuration.runs)]
            for metric in metrics:
                summary = configuration.summary(metric)
                row += [
                    math.nan if x is None else x
                    for x in ((summary.mean, summary.std, summary.low, summary.high) if summary else (None,) * 4)
                ]
            writer.writerow(row)
