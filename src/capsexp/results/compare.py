"""Runs compared: found under a folder, grouped by configuration (runs whose overrides differ only by
``seed`` form one), summarised over seeds with confidence intervals, compared with a reference
configuration by t-tests, and written as a page (``README.md``), a table (``comparison.csv``) and plots.
Runs of an experiment config (``experiment=<name>``) get its page's title, notes, paper figures and
reproduction check (:mod:`capsexp.results.study`). The command line is ``python -m capsexp.compare``
(:mod:`capsexp.compare`)."""

from __future__ import annotations

import copy
import csv
import importlib
import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from capsexp.errors import ConfigError, NoRunsError
from capsexp.locations import is_setting, working_root
from capsexp.locations import key as override_key
from capsexp.results import statistics
from capsexp.results.claims import BoundNotes, ClaimError, bind, p_text, unsupported_block
from capsexp.results.diagnostics import diagnostics_section
from capsexp.results.differences import (
    both_adjusted,
    distinct,
    family,
    family_size,
    metrics_of,
    permutation_adjusted,
    permutation_floor,
    places,
    references_of,
    scale,
    test_only,
    verdict,
)
from capsexp.results.events import event_files, event_folder
from capsexp.results.machine import MACHINE_FILE, describe_text
from capsexp.results.metric_names import (
    MODEL_FLOPS,
    MODEL_PARAMETERS,
    PRESENCE_GAP,
    is_accuracy,
)
from capsexp.results.plots import FOREST, HEADLINE, ForestRow, display, forest_plot, headline_rows, write_plots
from capsexp.results.revision import REVISION_FILE
from capsexp.results.revision import short as short_revision
from capsexp.results.runs import (
    KEPT_ORDER,
    KEPT_RUNS,
    OVERRIDES,
    OVERRIDES_AS_RUN,
    SEED_OVERRIDE,
    SWEEP_COMMAND,
    Configuration,
    Run,
    dates,
    find_runs,
    group,
    label_configurations,
    launches,
    sweep_command,
)
from capsexp.results.study import StudyPage, figure_for, page_for

PAGE, TABLE = "README.md", "comparison.csv"


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


def compared_rows(configurations: list[Configuration], metrics: list[str], page: StudyPage) -> list:
    """The page's comparisons (:func:`~capsexp.results.differences.family`) of the configurations that
    are compared (test-only ones, :func:`test_only`, are not), once for its table and its figure; none
    where it compares nothing."""
    in_comparison = [c for c in configurations if not test_only(c)]
    if len(in_comparison) < 2 or not (page.differences or page.hypotheses):
        return []
    return family(in_comparison, metrics, page)


def differences_section(rows: list, configurations: list[Configuration], metrics: list[str], page: StudyPage) -> str:
    """The page's tests: its declared hypotheses (:func:`hypotheses_section`), then each compared metric
    (the headline first, then the page's others) as each configuration minus each reference in one table,
    with intervals, and, without declared hypotheses, the page's one family of tests (``rows``:
    :func:`compared_rows`)."""
    if not rows:
        return ""
    declared = [row for row in rows if row.hypothesis is not None]
    table = [row for row in rows if row.hypothesis is None]
    left_out = [c.label for c in configurations if test_only(c)]
    in_comparison = [c for c in configurations if not test_only(c)]
    blocks = [hypotheses_section(declared, page)] if page.hypotheses else []
    if table:
        blocks.append(_differences(table, references_of(in_comparison, page), metrics, left_out, bool(page.hypotheses)))
    return "\n".join(blocks)


def differences_figure(rows: list, page: StudyPage, output: Path) -> Path | None:
    """``differences.png``: the page's comparisons (``rows``: :func:`compared_rows`) as a forest plot
    (:func:`~capsexp.results.plots.forest_plot`), the declared hypotheses first; None where the page
    compares nothing."""
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
                row.significant,
                places(factor),
            )
        )
    if not drawn:
        return None
    against = "" if len(references) != 1 else f" minus {display(next(iter(references)))}"
    if against and page.hypotheses:  # the hypotheses name their own references
        against = f" (unnamed rows:{against})"
    title = (
        f"Each comparison{against}: the mean difference and its 95% interval (paired by seed where the two share "
        "their seeds)"
        + (
            "; blue, first: the declared hypotheses, their smallest effect that matters shaded"
            if page.hypotheses
            else ""
        )
        + "; a filled dot: significant by the page's tests (Holm); diamonds: one run a side, no interval"
    )
    return forest_plot(drawn, output / FOREST, title)


PERMUTATION_TEXT = (
    f"Beside the t-test, an exact permutation test (every sign flip of the per-seed differences, or every "
    f"relabelling of the runs), which assumes no normality; with {statistics.MIN_RUNS_TO_TEST} paired seeds "
    f"its two-sided p cannot go below {2 / 2**statistics.MIN_RUNS_TO_TEST:g}."
)


def _differences(
    rows: list, references: list[Configuration], metrics: list[str], left_out: list[str], exploratory: bool
) -> str:
    against = ", ".join(f"`{r.label}`" for r in references)
    several = len(references) > 1
    tested = [row for row in rows if row.difference is not None and row.difference.tested]
    size = family_size(rows)
    permuted = permutation_adjusted(rows)
    intro = (
        f"Each configuration minus {'each of ' if several else ''}{against}, in points of accuracy (the presence "
        f"gap in score), with the {100 * statistics.CONFIDENCE:.0f}% confidence interval of the difference: paired "
        "by seed where the two share their seeds, Welch's otherwise. "
    )
    if exploratory:
        intro += (
            "Exploratory: differences and intervals, no tests (the page's tests are its declared hypotheses, above)."
        )
    elif not tested:
        intro += (
            f"No comparison has {statistics.MIN_RUNS_TO_TEST} runs a side: too few seeds to test, so none is "
            "tested; the differences and their intervals only."
        )
    else:
        intro += (
            f"A comparison is tested with {statistics.MIN_RUNS_TO_TEST} runs a side or more; fewer: too few seeds "
            f"to test. {PERMUTATION_TEXT}"
            + (
                f" Adjusted over this family it cannot reach {statistics.SIGNIFICANCE} with these seeds: a "
                "difference called significant here rests on the t-test."
                if permutation_floor(tested) * size >= statistics.SIGNIFICANCE
                else ""
            )
            + " detectable: the smallest "
            f"difference the seeds could find with {statistics.POWER:.0%} power at the observed spread (t-test at "
            f"level {statistics.SIGNIFICANCE}, before Holm's adjustment, which asks for more). The intervals are "
            "each comparison's own, not adjusted. "
            f"The {size} p-value{'s' if size > 1 else ''} of each test in this table {'are' if size > 1 else 'is'} "
            f"one family, adjusted by Holm's method; significant: the t-test's adjusted p below "
            f"{statistics.SIGNIFICANCE}."
        )
        twice = len(tested) - size
        if twice:
            intro += (
                f" {twice} of the {len(tested)} tested rows compare a pair the other way round: the same test, "
                "counted once."
            )
    if left_out:
        intro += (
            f" Not compared: {', '.join(f'`{label}`' for label in left_out)}, runs that test a checkpoint "
            "another configuration trained (`train=false`)."
        )
    header = (
        ["metric"] * (len(metrics) > 1) + ["reference"] * several + ["configuration", "runs", "difference", "95% CI"]
    )
    if not exploratory and tested:
        header += ["detectable", "p, t-test (Holm)", "p, permutation (Holm)", "significant"]
    lines = [f"## Against {against}", "", intro, "", "| " + " | ".join(header) + " |"]
    lines.append(
        "| "
        + " | ".join(
            "---" if name in ("metric", "reference", "configuration", "significant") else "---:" for name in header
        )
        + " |"
    )
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
        if not exploratory and tested:
            if found is None:
                cells += ["", "", "", ""]
            elif not found.tested:
                cells += ["", "", "", "too few seeds to test" if found.too_few_to_test else ""]
            else:
                verdict = "" if math.isnan(row.p_holm) else ("yes" if row.significant else "no")
                cells += [
                    f"{factor * found.detectable:.{places(factor)}f}",
                    p_text(row.p_holm),
                    p_text(permuted_p),
                    verdict,
                ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def hypotheses_section(rows: list, page: StudyPage) -> str:
    """The declared hypotheses, each with both tests (each adjusted by Holm over the hypotheses) and
    whether the runs support it by its declared test."""
    size = family_size(rows)
    adjusted = both_adjusted(rows)
    lines = [
        "## Declared hypotheses",
        "",
        " ".join(
            [
                f"Declared in `{page.source}` before the runs: each an arm minus its",
                "reference, its direction, the smallest difference that matters and its test.",
                f"The {size} tested {'are' if size != 1 else 'is'} the page's one family of p-values;"
                if size
                else "None is tested yet: the family of p-values is empty;",
                "each test's p-values are adjusted by Holm's method over them, and a hypothesis is supported",
                f"where its declared test's adjusted p is below {statistics.SIGNIFICANCE} (in its direction).",
                f"Tested with {statistics.MIN_RUNS_TO_TEST} runs a side or more. {PERMUTATION_TEXT}",
                f"detectable: the smallest difference the seeds could find with {statistics.POWER:.0%} power",
                f"at the observed spread (two-sided t-test at level {statistics.SIGNIFICANCE}, before Holm's",
                "adjustment, which asks for more). Differences in points of accuracy (the presence gap in",
                "score), with their two-sided 95% intervals, each its own (not adjusted).",
                "Everything else the page says is exploratory.",
            ]
        ),
        "",
        "| hypothesis | metric | arm − reference | direction | runs | difference | 95% CI | smallest effect "
        "| detectable | p, t-test (Holm) | p, permutation (Holm) | test | verdict |",
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
            f"{p_text(permuted)} | {hypothesis.test} | {verdict(row, adjusted[id(row)][1])} |"
        )
    return "\n".join(lines) + "\n"


# Overrides of a study's run that leave it the study's job: which study and budget, and the console's look.
_AS_THE_STUDY_RUNS_IT = re.compile(r"^(experiment|study|callbacks\.progress_bar)=")


def _as_the_study_runs_it(key: str, overrides: list[str]) -> bool:
    """Whether runs with ``overrides`` are the study's job that an expected figure's ``key`` names: their
    overrides, beyond where they went and their seed, are the key's (a run given other settings, e.g.
    fewer steps, is not checked against the study's figure)."""
    chosen = {
        o.lower() for o in overrides if is_setting(o) and not (SEED_OVERRIDE.match(o) or _AS_THE_STUDY_RUNS_IT.match(o))
    }
    return chosen == {part.lower() for part in key.split()}


def _source_events(source: str | None) -> set[str]:
    """The names of the event files of the runs kept on the results page ``source`` (a folder under the
    project's root): a run is one of them when its event files are (the names hold the time, host and
    process that wrote them)."""
    kept = working_root() / (source or "") / KEPT_RUNS
    if not source or not kept.is_dir():
        return set()
    return {path.name for path in kept.rglob("events.out.tfevents.*")}


def reproduction(configurations: list[Configuration], headline: str, page: StudyPage) -> tuple[str, list[str]]:
    """The expected figures of this budget against ours, for the configurations run as the study runs
    them: the section, and the configurations outside their tolerance (for ``--check``). The runs the
    figures came from are shown but not counted as a check: they cannot fail it."""
    expected = page.expected
    if expected is None:
        return "", []
    factor = scale(headline)
    source_events = _source_events(expected.source)
    lines = []
    failed = []
    own = 0
    for configuration in configurations:
        overrides = configuration.runs[0].overrides
        key = next((k for k in expected.figures if _as_the_study_runs_it(k, overrides)), None)
        if key is None:
            continue
        figure = expected.figures[key]
        values = [value for _, value in configuration.values(headline)]
        mean = sum(values) / len(values) if values else None
        tolerance = figure.tolerance_for(max(len(values), 1))
        names = {path.name for run in configuration.runs for path in event_files(run.folder)}
        if names and names <= source_events:
            own += 1
            verdict = "the figure's own runs"
        elif not values:
            verdict = "**no**"
        else:
            verdict = "yes" if abs(mean - figure.mean) <= tolerance + 1e-9 else "**no**"
        if verdict == "**no**":
            failed.append(configuration.label)
        here = f"{factor * mean:.2f}" if values else "not logged"
        lines.append(
            f"| {configuration.label} | {factor * figure.mean:.2f} ({figure.runs}) | ±{factor * tolerance:.2f} "
            f"| {here} ({len(values)}) | {verdict} |"
        )
    if not lines:  # none of these runs is a job of the study as configured
        return "", []
    source = f"`{expected.source}/`" if expected.source else "a page of the project"
    counted = len(lines) - own
    status = (
        f"Every figure came from these very runs ({source}): the table shows them, but checks nothing; "
        f"run `python -m capsexp -m experiment={page.experiment} study={page.budget}` to check them."
        if not counted
        else f"{counted} configuration{'s' if counted > 1 else ''} checked against the figures of {source}"
        + (f"; {own} are the figures' own runs, shown and not counted" if own else "")
        + "."
    )
    intro = (
        f"{page.source} states what this budget gave on the project's machine; a mean "
        f"within its tolerance{' (in points)' if factor == 100 else ''} reproduces it. The tolerance of a figure "
        "over several seeds is twice the standard error of the difference of its mean and ours, from its std and "
        f"both run counts, and at least {factor * statistics.REPRODUCTION_FLOOR:g}; of a figure of one run, the "
        "budget's. Run counts in brackets."
    )
    table = [
        f"| configuration | expected {headline} | tolerance | here | within tolerance |",
        "| --- | ---: | ---: | ---: | --- |",
        *lines,
    ]
    return "\n".join([f"## Reproduction check (study={page.budget})", "", intro, "", status, "", *table]) + "\n", failed


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


def header(page: StudyPage, runs: list[Run], folder: Path, relative: str, rebuild: str) -> str:
    machines = [describe_text(run.machine) for run in runs if run.machine]
    counts = {text: machines.count(text) for text in dict.fromkeys(machines)}
    machine = "; ".join(f"{text}" + (f" ({n} runs)" if len(counts) > 1 else "") for text, n in counts.items())
    unrecorded = len(runs) - len(machines)
    if unrecorded:
        machine += ("; " if machine else "") + f"not recorded for {unrecorded} run{'s' if unrecorded > 1 else ''}"
    precisions = [str(run.machine["precision"]) for run in runs if run.machine and run.machine.get("precision")]
    precision = ", ".join(
        f"{text} ({precisions.count(text)} run{'s' if precisions.count(text) > 1 else ''})"
        for text in dict.fromkeys(precisions)
    )
    if precisions and len(precisions) < len(runs):  # runs from before runs recorded it
        missing = len(runs) - len(precisions)
        precision += f"; not recorded for {missing} run{'s' if missing > 1 else ''}"
    seconds = [run.seconds for run in runs if run.seconds is not None]
    relaunched = sum((run.folder / OVERRIDES_AS_RUN).exists() for run in runs)
    provenance = (
        [
            f"- Overrides: {relaunched} of the runs were launched with other overrides, kept in their "
            f"`{OVERRIDES_AS_RUN}`; their `{OVERRIDES}` holds the experiment config's, which composes the same job."
        ]
        if relaunched
        else []
    )
    title = page.title + (f" (study={page.budget})" if page.experiment else "")
    return "\n".join(
        [
            f"# {title}",
            "",
            f"- Machine: {machine}.",
            # Runs from before runs recorded their precision have no line.
            *([f"- Precision: {precision}."] if precision else []),
            # Runs from before runs recorded their code have no line (their pages rebuild as they were).
            *([f"- Code: {code_revisions(runs)}."] if any(run.revision for run in runs) else []),
            f"- Runs: {len(runs)}, {dates(runs)}, {sum(seconds) / 60:.1f} min of run time (each run's first "
            f"to last logged scalar); {'in this folder' if relative == '.' else f'in `{relative}/`'}.",
            *command_lines(runs, folder, relative),
            f"- Rebuild this page, in its folder: `{rebuild}`",
            *provenance,
            "",
        ]
    )


def command_lines(runs: list[Run], folder: Path, relative: str) -> list[str]:
    """The header's command: the one launch's, or each launch's with its runs and their folder (``relative``:
    ``folder`` from the page's)."""
    found = launches(runs, folder)
    if len(found) == 1:
        return [f"- Command: `{sweep_command(runs, found[0][1])}`"]
    lines = [f"- Commands, {len(found)} launches:"]
    for home, given, members in found:
        place = Path(relative, home.relative_to(folder)).as_posix()
        lines.append(f"  - `{sweep_command(members, given)}`: {len(members)} runs, in `{place}/`")
    return lines


def code_revisions(runs: list[Run]) -> str:
    """The code revisions the runs ran (:mod:`capsexp.results.revision`): one for all, or each with its
    count and a warning that the runs differ in code; runs without the record counted apart."""
    texts = [short_revision(run.revision) for run in runs if run.revision]
    counts = {text: texts.count(text) for text in dict.fromkeys(texts)}
    unrecorded = len(runs) - len(texts)
    if len(counts) == 1 and not unrecorded:
        return f"`{texts[0]}` (every run)"
    parts = [f"`{text}` ({n} run{'s' if n > 1 else ''})" for text, n in counts.items()]
    if unrecorded:
        parts.append(f"not recorded for {unrecorded} run{'s' if unrecorded > 1 else ''}")
    warning = "; **the runs ran different code**" if len(counts) > 1 else ""
    return "; ".join(parts) + warning


RECORDED_HPARAMS = "hparams.yaml"  # the Lightning logger's record of the run's config, beside its event files


def keep_runs(runs: list[Run], folder: Path, output: Path) -> Path:
    """Copy what a page needs of each run (overrides, machine and code records, the composed config without
    absolute paths (:func:`without_locations`), event files, the model's recorded parameters and FLOPs:
    kilobytes) into ``output/runs/`` (replacing what it held), by the runs' paths under ``folder``. Overrides
    that name this machine's folders (``hydra.sweep.dir=...``, ``ckpt_path=...``) are left out."""
    kept = output / KEPT_RUNS
    if kept.resolve() == folder.resolve():
        return kept  # rebuilding from the kept runs: they stay as they are
    if kept.exists():
        shutil.rmtree(kept)
    kept.mkdir(parents=True)
    for home, given, _ in launches(runs, folder):
        if given is not None:
            (kept / home.relative_to(folder)).mkdir(parents=True, exist_ok=True)
            (kept / home.relative_to(folder) / SWEEP_COMMAND).write_text(yaml.safe_dump(given))
    (kept / KEPT_ORDER).write_text(yaml.safe_dump([run.folder.relative_to(folder).as_posix() for run in runs]))
    for run in runs:
        target = kept / run.folder.relative_to(folder)
        (target / OVERRIDES).parent.mkdir(parents=True, exist_ok=True)
        overrides = [o for o in run.overrides if is_setting(o) or override_key(o) == "task_name"]
        (target / OVERRIDES).write_text(yaml.safe_dump(overrides))
        if (run.folder / OVERRIDES_AS_RUN).exists():
            shutil.copy2(run.folder / OVERRIDES_AS_RUN, target / OVERRIDES_AS_RUN)
        for record in (MACHINE_FILE, REVISION_FILE):
            if (run.folder / record).exists():
                shutil.copy2(run.folder / record, target / record)
        if (run.folder / CONFIG).exists():  # the composed config, this machine's paths left out
            (target / CONFIG).write_text(OmegaConf.to_yaml(without_locations(OmegaConf.load(run.folder / CONFIG))))
        events_to = target / event_folder(run.folder).relative_to(run.folder)  # the run's layout
        events_to.mkdir(exist_ok=True)
        for events in event_files(run.folder):
            shutil.copy2(events, events_to / events.name)
        recorded_file = event_folder(run.folder) / RECORDED_HPARAMS
        if recorded_file.exists():  # the model's cost the run recorded; no paths
            recorded = yaml.safe_load(recorded_file.read_text()) or {}
            cost = {key: recorded[key] for key in (MODEL_PARAMETERS, MODEL_FLOPS) if key in recorded}
            (events_to / RECORDED_HPARAMS).write_text(yaml.safe_dump(cost))
    return kept


CONFIG = Path(".hydra") / "config.yaml"  # a run's composed config, as Hydra saved it
MACHINE_PATH = "<a path on the machine that ran it>"  # what a kept config holds in place of a path


def without_locations(config: DictConfig) -> DictConfig:
    """``config`` with every absolute path (a value, not an interpolation: a command-line
    ``paths.data_dir=/data/...``, ``hydra.run.dir``...) replaced by :data:`MACHINE_PATH`, so that a kept
    config names no machine's folders; the rest as the run composed it."""

    def scrub(node: DictConfig | ListConfig) -> None:
        for key in range(len(node)) if isinstance(node, ListConfig) else list(node.keys()):
            child = node._get_node(key)
            if isinstance(child, (DictConfig, ListConfig)):
                scrub(child)
            elif not child._is_interpolation() and isinstance(child._value(), str) and os.path.isabs(child._value()):
                node[key] = MACHINE_PATH

    config = copy.deepcopy(config)
    scrub(config)
    return config


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
    method = statistics.BOUNDED_INTERVAL if is_accuracy(headline) else "Student's t"
    results = (
        "## Results\n\n"
        f"Per configuration (runs that differ only by seed): {headline} as mean ± std over the runs with the "
        f"{100 * statistics.CONFIDENCE:.0f}% confidence interval of the mean ({method}), the other metrics "
        "as mean ± std (a mean alone for one run). Accuracies in %, final values except val/acc_best; "
        f"{PRESENCE_GAP}, where logged: the median over the validation images of the target class's score "
        "minus the largest other's, at the last validation."
        + (f" Paper: {page.paper.source}." if page.paper else "")
        + "\n"
        + (f"\nCommon to every run: `{' '.join(shared)}`\n" if shared else "")
        + "\n"
        + "".join(f"![{png.stem}]({png.name})\n\n" for png in in_results)
        + results_table(configurations, metrics, headline, page)
    )
    blocks = [
        header(page, runs, folder, relative, rebuild),
        unsupported_block(notes.failed),
        "".join(f"![{png.stem}]({png.name})\n" for png in first),  # the answer at a glance, then the notes
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
            if not is_setting(override) or SEED_OVERRIDE.match(override):
                continue
            if _AS_THE_STUDY_RUNS_IT.match(override) or override.split("=", 1)[0].lstrip("+") in page.swept:
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
        return BoundNotes(
            f"These runs were made with other settings than the study's ({', '.join(f'`{o}`' for o in changed)}), "
            "so the study's notes, which describe its own runs, are left out: "
            f"`{page.source}` has them.",
            [],
        )
    return bind(page, runs, page.source)
