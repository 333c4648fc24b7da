"""Which configurations a page compares, and how: each with each reference by
:func:`~capsexp.results.statistics.difference`, the p-values of one metric adjusted together by Holm's
method over the distinct hypotheses. The page's tables and the figures its notes quote
(:mod:`capsexp.results.claims`) both read them from here, so that they cannot disagree."""

from __future__ import annotations

from dataclasses import dataclass

from capsexp.results import statistics
from capsexp.results.metric_names import PRESENCE_GAP
from capsexp.results.runs import Configuration
from capsexp.results.study import StudyPage, matches


def scale(metric: str) -> float:
    """Accuracies are shown in %; the presence gap is a score."""
    return 1.0 if metric == PRESENCE_GAP else 100.0


def test_only(configuration: Configuration) -> bool:
    """Runs made with ``train=false``: they test a checkpoint another configuration trained (the
    adversarial study's black-box runs), so their clean accuracy repeats that configuration's."""
    return any(o.lower() == "train=false" for o in configuration.runs[0].overrides)


def references_of(configurations: list[Configuration], page: StudyPage) -> list[Configuration]:
    """The experiment's reference configurations that the runs include, else the first configuration (a
    user may run some arms of a study only)."""
    found = []
    for reference in page.references:
        match = next((c for c in configurations if matches(reference, c.runs[0].overrides)), None)
        if match is not None and all(match is not f for f in found):
            found.append(match)
    return found or configurations[:1]


@dataclass(frozen=True)
class Compared:
    """One row of a page's comparison: ``configuration`` minus ``reference`` (None: not logged by both),
    with its Holm-adjusted p-value."""

    reference: Configuration
    configuration: Configuration
    difference: statistics.Difference | None
    p_holm: float | None

    @property
    def significant(self) -> bool:
        return self.p_holm is not None and self.p_holm == self.p_holm and self.p_holm < statistics.SIGNIFICANCE


def compared(configurations: list[Configuration], metric: str, references: list[Configuration]) -> list[Compared]:
    """Each configuration against each reference for ``metric``; a pair compared both ways (each a
    reference) is one hypothesis, which Holm's adjustment counts once."""
    pairs = [(reference, c) for reference in references for c in configurations if c is not reference]
    found = [
        statistics.difference(arm, base) if (arm := c.values(metric)) and (base := r.values(metric)) else None
        for r, c in pairs
    ]
    first_p: dict[frozenset, float | None] = {}
    for (r, c), d in zip(pairs, found, strict=True):
        first_p.setdefault(frozenset((r.label, c.label)), d.p if d else None)
    hypotheses = list(first_p)
    adjusted = dict(zip(hypotheses, statistics.holm_adjusted([first_p[h] for h in hypotheses]), strict=True))
    return [Compared(r, c, d, adjusted[frozenset((r.label, c.label))]) for (r, c), d in zip(pairs, found, strict=True)]


def hypotheses(rows: list[Compared]) -> int:
    """How many distinct hypotheses ``rows`` test."""
    return len({frozenset((row.reference.label, row.configuration.label)) for row in rows})
