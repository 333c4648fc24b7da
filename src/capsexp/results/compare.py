"""Runs compared: found under a folder, grouped by configuration (runs whose overrides differ only by
``seed`` form one), summarised over seeds with confidence intervals, compared with a reference
configuration by t-tests, and written as a page (``README.md``), a table (``comparison.csv``) and plots.
Runs of an experiment config (``experiment=<name>``) get its page's title, notes, paper figures and
reproduction check (:mod:`capsexp.results.study`). The command line is ``python -m capsexp.compare``
(:mod:`capsexp.compare`).

This module puts a page together; its sentences are :mod:`capsexp.results.prose`'s (from the template
``templates/page.md``), its tables :mod:`capsexp.results.tables`', the runs it keeps
:mod:`capsexp.results.kept_runs`' and its reproduction check :mod:`capsexp.results.reproduction`'s."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path

from capsexp.errors import ConfigError, NoRunsError
from capsexp.locations import is_setting
from capsexp.overrides import key as override_key
from capsexp.records.metric_names import is_accuracy
from capsexp.results.claims import BoundNotes, ClaimError, bind, unsupported_block
from capsexp.results.diagnostics import diagnostics_section
from capsexp.results.differences import (
    Compared,
    distinct,
    family_count,
    family_size,
    metrics_of,
    not_learned,
    permutation_floor,
    places,
    references_of,
    scale,
    test_only,
)
from capsexp.results.kept_runs import keep_runs
from capsexp.results.plots import FOREST, HEADLINE, ForestRow, display, forest_plot, headline_rows, write_plots
from capsexp.results.prose import (
    against_intro,
    forest_title,
    header,
    hypotheses_intro,
    other_settings_note,
    results_intro,
    sentence,
)
from capsexp.results.reproduction import AS_THE_STUDY_RUNS_IT, reproduction
from capsexp.results.runs import Configuration, Run, find_runs, group, is_seed, label_configurations
from capsexp.results.study import StudyPage, page_for
from capsexp.results.tables import against_table, compared_rows, hypotheses_table, results_table, write_csv

PAGE = "README.md"


def differences_section(
    rows: list[Compared], configurations: list[Configuration], metrics: list[str], page: StudyPage
) -> str:
    """The page's tests: its declared hypotheses (:func:`hypotheses_section`), then each compared metric
    (the headline first, then the page's others) as each configuration minus each reference in one table,
    with intervals, and, without declared hypotheses, the page's one family of tests (``rows``:
    :func:`~capsexp.results.tables.compared_rows`)."""
    if not rows:
        return ""
    declared = [row for row in rows if row.hypothesis is not None]
    table = [row for row in rows if row.hypothesis is None]
    left_out = [c.label for c in configurations if test_only(c)]
    in_comparison = [c for c in configurations if not test_only(c)]
    blocks = [hypotheses_section(declared, page)] if page.hypotheses else []
    if table:
        references = references_of(in_comparison, page)
        mixed = None if page.hypotheses else page.exploratory
        blocks.append(against_section(table, references, metrics, left_out, bool(page.hypotheses), mixed))
    return "\n".join(blocks)


def against_section(
    rows: list[Compared],
    references: list[Configuration],
    metrics: list[str],
    left_out: list[str],
    exploratory: bool,
    mixed: str | None = None,
) -> str:
    """Each configuration against the ``references``: what the table shows, then the table (its tests
    unless the page is ``exploratory`` here, its hypotheses being its tests, or its runs ``mixed``: why
    they cannot be tested as one study)."""
    against = ", ".join(f"`{r.label}`" for r in references)
    several = len(references) > 1
    tested = [row for row in rows if row.difference is not None and row.difference.tested]
    size = family_size(rows)
    floor = permutation_floor(tested) if tested else None
    intro = against_intro(against, several, len(tested), size, floor, left_out, exploratory, mixed)
    table = against_table(rows, metrics, several, not (exploratory or mixed) and bool(tested))
    return "\n".join([sentence("against.heading", against=against), "", intro, "", *table]) + "\n"


def hypotheses_section(rows: list[Compared], page: StudyPage) -> str:
    """The declared hypotheses: how they are tested, then their table."""
    tested = [min(row.difference.runs) for row in rows if row.difference is not None and row.difference.tested]
    intro = hypotheses_intro(family_size(rows), page, family_count(rows), min(tested, default=None))
    heading = sentence("hypotheses.heading.exploratory" if page.exploratory else "hypotheses.heading")
    return "\n".join([heading, "", intro, "", *hypotheses_table(rows, page)]) + "\n"


def differences_figure(rows: list, page: StudyPage, output: Path) -> Path | None:
    """``differences.png``: the page's comparisons (``rows``: :func:`~capsexp.results.tables.compared_rows`)
    as a forest plot (:func:`~capsexp.results.plots.forest_plot`), the declared hypotheses first; None
    where the page compares nothing."""
    references = {row.reference.label for row in rows if row.hypothesis is None}
    seen, drawn = set(), []
    for row in rows:
        if row.difference is None or (row.hypothesis is None and distinct(row) in seen):
            continue  # a pair the table compares both ways is drawn once
        seen.add(distinct(row))
        factor = scale(row.metric)
        several = row.hypothesis is not None or len(references) > 1
        label = display(row.configuration.label) + (f" − {display(row.reference.label)}" if several else "")
        found = row.difference
        drawn.append(
            ForestRow(
                label,
                f"{row.metric}, difference ({'points' if factor == 100 else 'score'})",
                factor * found.mean,
                None if found.low is None else factor * found.low,
                None if found.high is None else factor * found.high,
                row.hypothesis.smallest_effect if row.hypothesis else None,
                row.hypothesis is not None,
                # a page whose runs cannot be tested as one study tests none of its other comparisons
                row.significant and not (row.hypothesis is None and page.exploratory) and not row.not_judged,
                places(factor),
                row.hypothesis.margin if row.hypothesis else None,
                bool(row.not_judged),
                not (not_learned(row.configuration) or not_learned(row.reference)),
                row.equivalent,
            )
        )
    if not drawn:
        return None
    title = forest_title(
        [display(label) for label in references],
        bool(page.hypotheses),
        equivalent=any(row.equivalent for row in drawn),
        not_judged=any(row.not_judged for row in drawn),
        unlearned=not all(row.sets_axis for row in drawn),
    )
    return forest_plot(drawn, output / FOREST, title)


def _page_function(key: str, name: str):
    """The function ``module.function`` that the page's ``key`` names."""
    module, _, function = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError, ValueError) as error:
        raise ConfigError(f"page.{key}: {name} is no function ({error})") from error


def extra_sections(page: StudyPage, runs: list[Run], output: Path) -> list[str]:
    """The Markdown of the page's ``sections``: functions ``(runs, page, output) -> str`` named by module path."""
    return [_page_function("sections", name)(runs, page, output).strip() + "\n" for name in page.sections]


def lead_figure(page: StudyPage, runs: list[Run], output: Path) -> Path | None:
    """The page's ``lead_figure``, written into ``output``: the figure that shows its answer."""
    return _page_function("lead_figure", page.lead_figure)(runs, page, output) if page.lead_figure else None


@dataclass
class Comparison:
    output: Path
    failed: list[str]  # configurations outside the expected figures' tolerance


def compare(folder: Path, output: Path | None = None, keep: bool = False) -> Comparison:
    """Write the page of every run under ``folder`` into ``output`` (default: ``folder``); ``keep``
    copies the runs into ``output/runs/`` first (replacing the runs kept there before) and writes the
    page from the copies."""
    folder, output = Path(folder), Path(output or folder)
    runs = find_runs(folder)
    if not runs:
        raise NoRunsError(f"no runs under {folder} (a run is a folder with .hydra/overrides.yaml and event files)")
    output.mkdir(parents=True, exist_ok=True)
    if keep:
        folder = keep_runs(runs, folder, output)
        runs = find_runs(folder)
    page = page_for(runs)
    shared = label_configurations(runs)
    configurations = group(runs)
    metrics = metrics_of(runs)
    headline = page.headline_metric(metrics)
    relative = os.path.relpath(folder.resolve(), output.resolve())
    rebuild = "python -m capsexp.compare ." if relative == "." else f"python -m capsexp.compare {relative} --output ."
    check_text, failed = reproduction(configurations, headline, page)
    in_comparison = [c for c in configurations if not test_only(c)]
    compared = in_comparison and page.differences
    reference_labels = [c.label for c in references_of(in_comparison, page)] if compared else []
    compared_metrics = [headline, *(m for m in page.metrics if m != headline)]
    panels = [
        (
            f"{metric} (%)" if scale(metric) == 100 else metric,
            headline_rows(in_comparison, metric, scale(metric), reference_labels),
        )
        for metric in compared_metrics
    ]
    notes = notes_of(page, runs, configurations)
    plots = write_plots(configurations, metrics, output, [panel for panel in panels if panel[1]], reference_labels)
    lead = lead_figure(page, runs, output)
    headline_plot = [png for png in plots if png.name == HEADLINE]
    rows = compared_rows(configurations, compared_metrics, page)
    forest = differences_figure(rows, page, output)
    # The answer first: the differences (with the declared hypotheses), then a study's own lead figure;
    # the configurations' values head the results table.
    first = [png for png in (forest, lead) if png] or headline_plot
    in_results = headline_plot if first != headline_plot else []
    results = (
        results_intro(headline, page, shared, is_accuracy(headline))
        + "".join(f"![{png.stem}]({png.name})\n\n" for png in in_results)
        + results_table(configurations, metrics, headline, page)
    )
    blocks = [
        header(page, runs, folder, relative, rebuild),
        unsupported_block(notes.failed),
        "".join(f"![{png.stem}]({png.name})\n" for png in first),  # the answer at a glance, then the notes
        _page_function("answer", page.answer)(runs, page, output).strip() + "\n" if page.answer else "",
        notes.text + "\n" if notes.text else "",
        results,
        differences_section(rows, configurations, compared_metrics, page),
        diagnostics_section(configurations),
        *extra_sections(page, runs, output),
        check_text,
        "".join(f"![{png.stem}]({png.name})\n" for png in plots if png not in first + in_results),
    ]
    (output / PAGE).write_text("\n".join(block for block in blocks if block))
    write_csv(configurations, metrics, output)
    if notes.failed:
        raise ClaimError(
            f"{page.source}: these runs do not support the page's claim"
            f"{'s' if len(notes.failed) > 1 else ''} "
            + "; ".join(f"{claim!r}" for claim in notes.failed)
            + f" (the page is written to {output / PAGE}, the claims marked)"
        )
    return Comparison(output, failed)


def other_settings(runs: list[Run], page: StudyPage) -> list[str]:
    """The overrides of the runs that the study's sweep does not set (beyond where they went, their seed,
    which study and budget and the console's look): a user's changes (``trainer.max_steps=20``).
    Test-only runs, the study's own step after the sweep, are not counted."""
    found = []
    for run in runs:
        if any(o.lower() == "train=false" for o in run.overrides):
            continue
        for override in run.overrides:
            if not is_setting(override) or is_seed(override):
                continue
            if AS_THE_STUDY_RUNS_IT.match(override) or override_key(override) in page.swept:
                continue
            found.append(override)
    return list(dict.fromkeys(found))


def notes_of(page: StudyPage, runs: list[Run], configurations: list[Configuration]) -> BoundNotes:
    """The page's notes with their figures from the runs and the claims checked
    (:func:`capsexp.results.claims.bind`); for runs made with other settings than the study's, a line
    saying so instead: the notes describe the study's own runs."""
    if not page.notes:
        return BoundNotes("", [])
    changed = other_settings(runs, page)
    if changed:
        return BoundNotes(other_settings_note(changed, page), [])
    return bind(page, runs, page.source)
