"""The sentences of a results page, from its template (``templates/page.md``, filled by
:class:`string.Template`): the header (machine, code, runs, commands), the results' and the comparisons'
introductions, the reproduction check's, the figure of the differences' title. This module picks which
sentences a page says from its runs and fills in their values; the tables are
:mod:`capsexp.results.tables`'."""

from __future__ import annotations

import functools
import re
from importlib import resources
from pathlib import Path
from string import Template

from capsexp.records.machine import describe_text
from capsexp.records.metric_names import PRESENCE_GAP
from capsexp.records.revision import short as short_revision
from capsexp.results import statistics
from capsexp.results.runs import OVERRIDES, OVERRIDES_AS_RUN, Run, dates, launches, sweep_command
from capsexp.results.study import StudyPage

_ENTRY = re.compile(r"^<!-- ([\w.]+) -->$", re.MULTILINE)


@functools.cache
def _sentences() -> dict[str, Template]:
    """The template's entries by name, each its lines joined with a space."""
    text = resources.files("capsexp.results").joinpath("templates", "page.md").read_text(encoding="utf-8")
    parts = _ENTRY.split(text)[1:]  # the text before the first entry says how the file is read
    return {
        name: Template(" ".join(line.rstrip() for line in body.strip("\n").splitlines()))
        for name, body in zip(parts[::2], parts[1::2], strict=True)
    }


def sentence(name: str, **values: object) -> str:
    """The template's entry ``name`` with ``values`` filled in."""
    return _sentences()[name].substitute(values)


def runs_text(count: int) -> str:
    """``1 run``, ``3 runs``."""
    return f"{count} run{'s' if count > 1 else ''}"


def permutation_reach(seeds: int = statistics.MIN_RUNS_TO_TEST) -> str:
    """The exact permutation test, and its smallest two-sided p at ``seeds`` paired seeds (2 / 2^seeds)."""
    return sentence("permutation", min_runs=seeds, floor=f"{2 / 2**seeds:.3g}")


PERMUTATION = permutation_reach()


def header(page: StudyPage, runs: list[Run], folder: Path, relative: str, rebuild: str) -> str:
    """The page's title and what made its runs: machine, precision, code, runs, commands, how to rebuild."""
    machines = [describe_text(run.machine) for run in runs if run.machine]
    counts = {text: machines.count(text) for text in dict.fromkeys(machines)}
    machine = "; ".join(
        sentence("header.machine.runs", machine=text, runs=f"{n} runs") if len(counts) > 1 else text
        for text, n in counts.items()
    )
    unrecorded = len(runs) - len(machines)
    if unrecorded:
        machine += ("; " if machine else "") + sentence("header.unrecorded", runs=runs_text(unrecorded))
    precisions = [str(run.machine["precision"]) for run in runs if run.machine and run.machine.get("precision")]
    precision = ", ".join(
        sentence("header.precision.runs", precision=text, runs=runs_text(precisions.count(text)))
        for text in dict.fromkeys(precisions)
    )
    if precisions and len(precisions) < len(runs):  # runs from before runs recorded it
        precision += "; " + sentence("header.unrecorded", runs=runs_text(len(runs) - len(precisions)))
    seconds = [run.seconds for run in runs if run.seconds is not None]
    resumed = sum(len(run.spans) > 1 for run in runs)
    relaunched = sum((run.folder / OVERRIDES_AS_RUN).exists() for run in runs)
    provenance = (
        [sentence("header.relaunched", relaunched=relaunched, as_run=OVERRIDES_AS_RUN, overrides=OVERRIDES)]
        if relaunched
        else []
    )
    title = (
        sentence("header.title.study", title=page.title, budget=page.budget)
        if page.experiment
        else sentence("header.title", title=page.title)
    )
    where = sentence("header.runs.here") if relative == "." else sentence("header.runs.there", relative=relative)
    return "\n".join(
        [
            title,
            "",
            sentence("header.machine", machine=machine),
            # Runs from before runs recorded their precision have no line.
            *([sentence("header.precision", precision=precision)] if precision else []),
            # Runs from before runs recorded their code have no line (their pages rebuild as they were).
            *([sentence("header.code", code=code_revisions(runs))] if any(run.revision for run in runs) else []),
            sentence(
                "header.runs.resumed" if resumed else "header.runs",
                count=len(runs),
                dates=dates(runs),
                minutes=f"{sum(seconds) / 60:.1f}",
                where=where,
                resumed=runs_text(resumed),
            ),
            *command_lines(runs, folder, relative),
            sentence("header.rebuild", rebuild=rebuild),
            *provenance,
            "",
        ]
    )


def command_lines(runs: list[Run], folder: Path, relative: str) -> list[str]:
    """The header's command: the one launch's, or each launch's with its runs and their folder (``relative``:
    ``folder`` from the page's)."""
    found = launches(runs, folder)
    if len(found) == 1:
        return [sentence("header.command", command=sweep_command(runs, found[0][1]))]
    lines = [sentence("header.commands", launches=len(found))]
    for home, given, members in found:
        place = Path(relative, home.relative_to(folder)).as_posix()
        lines.append(sentence("header.launch", command=sweep_command(members, given), count=len(members), place=place))
    return lines


def code_revisions(runs: list[Run]) -> str:
    """The code revisions the runs ran (:mod:`capsexp.records.revision`): one for all, or each with its
    count and a warning that the runs differ in code; runs without the record counted apart."""
    texts = [short_revision(run.revision) for run in runs if run.revision]
    counts = {text: texts.count(text) for text in dict.fromkeys(texts)}
    unrecorded = len(runs) - len(texts)
    if len(counts) == 1 and not unrecorded:
        return sentence("header.code.every", revision=texts[0])
    parts = [sentence("header.code.runs", revision=text, runs=runs_text(n)) for text, n in counts.items()]
    if unrecorded:
        parts.append(sentence("header.unrecorded", runs=runs_text(unrecorded)))
    warning = "; " + sentence("header.code.different") if len(counts) > 1 else ""
    return "; ".join(parts) + warning


def other_settings_note(changed: list[str], page: StudyPage) -> str:
    """In place of the notes, for runs made with ``changed`` settings: the notes describe the study's own."""
    return sentence("notes.other_settings", overrides=", ".join(f"`{o}`" for o in changed), source=page.source)


def results_intro(headline: str, page: StudyPage, shared: list[str], bounded: bool) -> str:
    """The results section down to its table: what each figure is (``bounded``: the headline's interval is
    :data:`~capsexp.results.statistics.BOUNDED_INTERVAL`'s), the paper's source, what every run shares."""
    method = statistics.BOUNDED_INTERVAL if bounded else sentence("results.student")
    intro = sentence(
        "results.intro",
        headline=headline,
        confidence=f"{100 * statistics.CONFIDENCE:.0f}",
        method=method,
        presence_gap=PRESENCE_GAP,
    )
    if page.paper:
        intro += " " + sentence("results.paper", source=page.paper.source)
    common = f"\n{sentence('results.shared', shared=' '.join(shared))}\n" if shared else ""
    return f"{sentence('results.heading')}\n\n{intro}\n{common}\n"


def against_intro(
    against: str,
    several: bool,
    tested: int,
    size: int,
    floor: float | None,
    left_out: list[str],
    exploratory: bool,
    mixed: str | None = None,
) -> str:
    """What the table of each configuration against the references (``against``, Markdown) shows: its
    intervals, and its tests (``tested`` rows, ``size`` distinct p-values, ``floor`` the smallest p the
    permutation test can give) or why there are none (``exploratory``: the page's hypotheses are its tests;
    ``mixed``: why its runs cannot be tested as one study); the configurations ``left_out``."""
    parts = [
        sentence(
            "against.intro",
            each_of=sentence("against.each_of") + " " if several else "",
            against=against,
            confidence=f"{100 * statistics.CONFIDENCE:.0f}",
        )
    ]
    if exploratory:
        parts.append(sentence("against.exploratory"))
    elif mixed:
        parts.append(sentence("against.mixed", why=mixed))
    elif not tested:
        parts.append(sentence("against.untested", min_runs=statistics.MIN_RUNS_TO_TEST))
    else:
        parts += [sentence("against.tested", min_runs=statistics.MIN_RUNS_TO_TEST), PERMUTATION]
        if floor * size >= statistics.SIGNIFICANCE:
            parts.append(sentence("against.floor", significance=statistics.SIGNIFICANCE))
        parts.append(
            sentence(
                "against.family",
                power=f"{statistics.POWER:.0%}",
                significance=statistics.SIGNIFICANCE,
                size=size,
                p_values="p-values" if size > 1 else "p-value",
                are="are" if size > 1 else "is",
            )
        )
        if tested - size:
            parts.append(sentence("against.twice", twice=tested - size, tested=tested))
    if left_out:
        parts.append(sentence("against.left_out", labels=", ".join(f"`{label}`" for label in left_out)))
    return " ".join(parts)


def hypotheses_intro(size: int, page: StudyPage, families: int = 1, seeds: int | None = None) -> str:
    """What the declared hypotheses' table shows: where they were declared, their family of ``size``
    p-values (or ``families`` of up to ``size``: a routing's verdicts each), how each is judged, and the
    permutation test's reach at the fewest paired ``seeds`` a tested hypothesis has (None: at the fewest
    tested)."""
    if not size:
        family = sentence("hypotheses.empty")
    elif families > 1:
        family = sentence("hypotheses.families", count=families, family="routing", size=size)
    else:
        family = sentence("hypotheses.family", size=size, are="are" if size != 1 else "is")
    declared = (
        sentence("hypotheses.exploratory", source=page.source, why=page.exploratory)
        if page.exploratory
        else sentence("hypotheses.declared", source=page.source)
    )
    return " ".join(
        [
            declared,
            family,
            sentence("hypotheses.tests", significance=statistics.SIGNIFICANCE, min_runs=statistics.MIN_RUNS_TO_TEST),
            permutation_reach(seeds or statistics.MIN_RUNS_TO_TEST),
            sentence("hypotheses.detectable", power=f"{statistics.POWER:.0%}", significance=statistics.SIGNIFICANCE),
        ]
    )


def forest_title(
    references: list[str], hypotheses: bool, equivalent: bool = False, not_judged: bool = False, unlearned: bool = False
) -> str:
    """The title of the figure of the differences: against the reference, where its rows have one
    (``references``, as shown), the declared hypotheses first where the page has them; what a green square
    (``equivalent``), a grey declared row (``not_judged``) and a cross at the axis's edge (``unlearned``: a
    net that did not learn) are."""
    against = "" if len(references) != 1 else " " + sentence("forest.minus", reference=references[0])
    if against and hypotheses:  # the hypotheses name their own references
        against = " " + sentence("forest.unnamed", reference=references[0])
    title = sentence("forest.title.hypotheses" if hypotheses else "forest.title", against=against)
    extra = [
        sentence(key)
        for key, shown in (
            ("forest.equivalent", equivalent),
            ("forest.not_judged", not_judged),
            ("forest.unlearned", unlearned),
        )
        if shown
    ]
    return "; ".join([title, *extra])


def reproduction_intro(page: StudyPage, source: str | None, factor: float, counted: int, own: int) -> list[str]:
    """The reproduction check's heading, introduction and status: ``counted`` configurations checked
    against the figures of the page ``source``, ``own`` shown that are those figures' own runs."""
    named = f"`{source}/`" if source else sentence("reproduction.a_page")
    intro = sentence(
        "reproduction.intro",
        source=page.source,
        in_points=" " + sentence("reproduction.in_points") if factor == 100 else "",
        floor=f"{factor * statistics.REPRODUCTION_FLOOR:g}",
    )
    if not counted:
        status = sentence("reproduction.own_only", source=named, experiment=page.experiment, budget=page.budget)
    else:
        checked = f"{counted} configuration{'s' if counted > 1 else ''}"
        status = (
            sentence("reproduction.checked.own", checked=checked, source=named, own=own)
            if own
            else sentence("reproduction.checked", checked=checked, source=named)
        )
    return [sentence("reproduction.heading", budget=page.budget), "", intro, "", status]
