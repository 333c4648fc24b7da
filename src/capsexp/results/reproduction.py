"""The reproduction check of a study's page: the figures a budget gave on the project's machine
(``page.expected``) against the runs', for the runs made as the study makes them (``--check`` fails on
a configuration outside its tolerance)."""

from __future__ import annotations

import re

from capsexp.locations import is_setting, working_root
from capsexp.records.events import event_files
from capsexp.results.differences import scale
from capsexp.results.prose import reproduction_intro
from capsexp.results.runs import KEPT_RUNS, Configuration, is_seed
from capsexp.results.study import StudyPage

# Overrides of a study's run that leave it the study's job: which study and budget, and the console's look.
AS_THE_STUDY_RUNS_IT = re.compile(r"^(experiment|study|callbacks\.progress_bar)=")


def _as_the_study_runs_it(key: str, overrides: list[str]) -> bool:
    """Whether runs with ``overrides`` are the study's job that an expected figure's ``key`` names: their
    overrides, beyond where they went and their seed, are the key's (a run given other settings, e.g.
    fewer steps, is not checked against the study's figure)."""
    chosen = {o.lower() for o in overrides if is_setting(o) and not (is_seed(o) or AS_THE_STUDY_RUNS_IT.match(o))}
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
    counted = len(lines) - own
    table = [
        f"| configuration | expected {headline} | tolerance | here | within tolerance |",
        "| --- | ---: | ---: | ---: | --- |",
        *lines,
    ]
    text = "\n".join([*reproduction_intro(page, expected.source, factor, counted, own), "", *table]) + "\n"
    return text, failed
