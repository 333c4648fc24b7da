"""A routing verdict's page sections (experiment=routing_verdict, routing_reference): each routing's answers to
its declared questions in one grid, and the measures beside accuracy of whether it routes: how far its
couplings depend on the image and on what it is from uniform, its dead capsules
(:mod:`capsexp.callbacks.routing_diagnostics`) and the equivariance of its class poses
(:mod:`capsexp.callbacks.equivariance`), each mean ± std over the seeds."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from capsexp.records.verdicts import write_verdicts
from capsexp.results.differences import Compared, family, places, scale, verdict
from capsexp.results.plots import display
from capsexp.results.runs import Configuration, Run, group
from capsexp.results.study import StudyPage

# The measures the verdict's callbacks log after testing, in the order of the table's columns: a tag's
# pattern, and how its column is headed (the layer or transform filled in from the tag).
MEASURES = (
    (re.compile(r"routing/(?P<where>[^/]+)/test_image_dependence$"), "image dependence, {where}"),
    (re.compile(r"routing/(?P<where>[^/]+)/test_uniform_distance$"), "from uniform, {where}"),
    (re.compile(r"routing/(?P<where>[^/]+)/test_dead_children$"), "dead children, {where}"),
    (re.compile(r"routing/(?P<where>[^/]+)/test_dead_parents$"), "dead parents, {where}"),
    (re.compile(r"equivariance/(?P<where>[^/]+)/error$"), "equivariance error, {where}"),
    (re.compile(r"equivariance/(?P<where>[^/]+)/pose_change$"), "pose change, {where}"),
)


def measured_tags(runs: list[Run]) -> list[tuple[str, str]]:
    """``(tag, column heading)`` of each verdict measure some run logged, in :data:`MEASURES`' order."""
    logged = list(dict.fromkeys(tag for run in runs for tag in run.scalars))
    return [
        (tag, heading.format(where=match["where"]))
        for pattern, heading in MEASURES
        for tag in logged
        if (match := pattern.match(tag))
    ]


def _mean_std(configuration: Configuration, tag: str) -> str:
    values = [value for run in configuration.runs if (value := run.final(tag)) is not None]
    if not values:
        return ""
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{np.mean(values):.3f} ± {np.std(values, ddof=1):.3f}"


def routing_measures(runs: list[Run], page: StudyPage, output: Path) -> str:
    """The measures of whether each configuration routes, one row each (blank: not a capsule net's)."""
    tags = measured_tags(runs)
    if not tags:
        return ""
    header = ["configuration", "runs", *(heading for _, heading in tags)]
    lines = [
        "## Does it route? The couplings and the poses",
        "",
        "Measured after testing, on the plain test digits (the equivariance on the first of them), mean ± std "
        "over the seeds. Image dependence: the total variation between a child's couplings in one image and "
        "in another (0: the same couplings for every image), beside their total variation from uniform "
        "coupling (0: uniform). Dead: the share of the layer's capsules never active above 0.01 on any test "
        "image. Equivariance error: the share of the target class pose's change under the transform that one "
        "linear map per class, fitted on half the images, leaves unexplained on the other half (0: the pose "
        "moves as a linear function of the transform; 1: the map predicts no better than the pose unmoved; "
        "above 1: worse); pose change: how far the pose moves, "
        "as a share of its length. A shuffled arm's couplings are measured before they are shuffled.",
        "",
        "| " + " | ".join(header) + " |",
        "| --- | " + " | ".join("---:" for _ in header[1:]) + " |",
    ]
    for configuration in group(runs):
        cells = [_mean_std(configuration, tag) for tag, _ in tags]
        lines.append(f"| {display(configuration.label)} | {len(configuration.runs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def short_verdict(row: Compared, exploratory: bool = False) -> str:
    """A declared hypothesis's verdict in a few words, with the mean difference (points of accuracy);
    ``exploratory`` as :func:`~capsexp.results.differences.verdict` takes it."""
    if row.difference is None:
        return "not run"
    if row.not_judged:
        return "not judged"
    said = verdict(row, None, exploratory)
    factor = scale(row.metric)
    difference = f"{factor * row.difference.mean:+.{places(factor)}f}"
    if said.startswith("**supported**"):
        return f"**supported**, {'above' if row.difference.mean > 0 else 'below'} ({difference})"
    if said.startswith("**equivalent**"):
        return f"{said.split(' (')[0]} ({difference})"
    if said.startswith("cannot tell"):
        return f"cannot tell ({difference})"
    if said.startswith("a difference (exploratory)"):
        return f"a difference, exploratory: {'above' if row.difference.mean > 0 else 'below'} ({difference})"
    if said.startswith("within "):
        return f"{said.split(' (')[0]}, exploratory ({difference})"
    return said


def verdict_grid(runs: list[Run], page: StudyPage, output: Path) -> str:
    """Each routing's verdict on each declared question, one row a routing (its family), one column a
    question: the declared hypotheses' table in one screen."""
    rows = [row for row in family(group(runs), [], page) if row.hypothesis is not None]
    if not rows:
        return ""

    def question(row: Compared) -> str:
        return row.hypothesis.name.removeprefix(f"{row.hypothesis.family}: ")

    questions = list(dict.fromkeys(map(question, rows)))
    answers: dict[str, dict[str, str]] = {}
    withheld: dict[str, dict[str, list[str]]] = {}  # why a hypothesis is not judged: each routing's questions
    for row in rows:
        said = short_verdict(row, bool(page.exploratory))
        routing = row.hypothesis.family or "the routing"
        answers.setdefault(routing, {})[question(row)] = said
        if row.not_judged:
            withheld.setdefault(row.not_judged, {}).setdefault(routing, []).append(question(row))
    lines = [
        "## The verdicts",
        "",
        "Each declared hypothesis's verdict, with the mean difference in points (routing minus control), as "
        "the table of the declared hypotheses gives it in full: supported (the routing above or below the "
        "control: the exact sign-flip test, Holm within the routing's family), equivalent within the declared "
        "margin (two one-sided tests), or cannot tell at this power (neither); not judged where the runs cannot "
        "answer the question (said under the grid), whatever the test gives.",
        "",
        "| routing | " + " | ".join(questions) + " |",
        "| --- | " + " | ".join("---" for _ in questions) + " |",
    ]
    for name, said in answers.items():
        lines.append(f"| {name} | " + " | ".join(said.get(q, "") for q in questions) + " |")
    if withheld:
        lines += ["", "Not judged:", ""]
        for reason, asked in withheld.items():
            by_questions: dict[tuple[str, ...], list[str]] = {}
            for routing, its in asked.items():
                by_questions.setdefault(tuple(its), []).append(routing)
            lines += [
                f"- {', '.join(routings)} ({'; '.join(its)}): {reason}." for its, routings in by_questions.items()
            ]
    if page.exploratory:
        lines += ["", f"Read as exploratory: {page.exploratory}; no verdict is kept for model cards."]
    elif page.verdicts_setting:
        reasons = {row.hypothesis.family or "the routing": {} for row in rows}
        for row in rows:
            if row.not_judged:
                reasons[row.hypothesis.family or "the routing"][question(row)] = f"not judged: {row.not_judged}"
        _keep({routing: {**said, **reasons[routing]} for routing, said in answers.items()}, page, output)
    return "\n".join(lines) + "\n"


def _keep(answers: dict[str, dict[str, str]], page: StudyPage, output: Path) -> None:
    """The verdicts beside the page (records.verdicts), for the model cards of nets with these routings:
    only those of routings whose every question was answered by runs."""
    from capsexp.locations import CHECKOUT

    complete = {
        routing: {question: said.replace("**", "") for question, said in found.items()}
        for routing, found in answers.items()
        if not any(said == "not run" or said.startswith(("too few", "not tested")) for said in found.values())
    }
    folder = output.resolve()
    named = folder.relative_to(CHECKOUT).as_posix() if CHECKOUT and folder.is_relative_to(CHECKOUT) else folder.name
    write_verdicts(output, named, page.verdicts_setting, complete)
