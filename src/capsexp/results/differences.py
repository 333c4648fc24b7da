"""Which configurations a page compares, and how: each with each reference by
:func:`~capsexp.results.statistics.difference`, and the page's one family of p-values. A page whose
experiment declares hypotheses (``page.hypotheses``) tests those and only those, adjusted together by
Holm's method, and shows every other comparison as a difference with its interval (exploratory); a page
without them adjusts every comparison its table tests (every metric, every reference) together. The
page's tables and the figures its notes quote (:mod:`capsexp.results.claims`) both read them from here,
so that they cannot disagree."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from capsexp.locations import RUN_CONFIG
from capsexp.records.metric_names import PRESENCE_GAP, TEST_ACC, VAL_ACC, VAL_ACC_BEST, learned, rotation_angle
from capsexp.results import statistics
from capsexp.results.runs import Configuration, Run
from capsexp.results.study import Hypothesis, StudyPage, matches


def metrics_of(runs: list[Run]) -> list[str]:
    """The metrics a comparison shows: best, final validation and test accuracy, the rotated test sets
    by angle, the other named test sets, the presence gap."""
    tags = {tag for run in runs for tag in run.scalars}
    rotations = sorted((tag for tag in tags if rotation_angle(tag) is not None), key=rotation_angle)
    named_sets = sorted(tag for tag in tags if tag.startswith(f"{TEST_ACC}_") and rotation_angle(tag) is None)
    return (
        [tag for tag in (VAL_ACC_BEST, VAL_ACC, TEST_ACC) if tag in tags]
        + rotations
        + named_sets
        + ([PRESENCE_GAP] if PRESENCE_GAP in tags else [])
    )


def scale(metric: str) -> float:
    """Accuracies are shown in %; the presence gap is a score."""
    return 1.0 if metric == PRESENCE_GAP else 100.0


def places(factor: float) -> int:
    """Decimals a difference is shown with, by its :func:`scale`: hundredths of a point of accuracy,
    thousandths of a score."""
    return 2 if factor == 100 else 3


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


def find(configurations: list[Configuration], key: str) -> Configuration | None:
    """The configuration labelled ``key``, else the one whose overrides include every override of it."""
    found = next((c for c in configurations if c.label == key), None)
    return found or next((c for c in configurations if matches(key, c.runs[0].overrides)), None)


@dataclass(frozen=True)
class Compared:
    """One comparison of a page: ``configuration`` minus ``reference`` in ``metric`` (``difference``
    None: not logged by both), with its p-value adjusted over the page's family (None: not in it).
    ``hypothesis``: the declared hypothesis it tests, if any."""

    metric: str
    reference: Configuration
    configuration: Configuration
    difference: statistics.Difference | None
    p_holm: float | None
    hypothesis: Hypothesis | None = None
    equivalence: statistics.Equivalence | None = None  # where the hypothesis declares a margin
    p_equivalence_holm: float | None = None  # its two one-sided tests' p, Holm over the margins declared
    # Why the runs cannot answer its hypothesis whatever its test gives (the hypothesis's own reason, or
    # an arm that did not learn); "" where they can.
    not_judged: str = ""

    @property
    def p(self) -> float | None:
        """The p-value the family adjusts: the declared test's, the t-test's otherwise."""
        if self.difference is None:
            return None
        if self.hypothesis is not None and self.hypothesis.test == "permutation":
            return self.difference.p_permutation
        return self.difference.p

    @property
    def significant(self) -> bool:
        return self.p_holm is not None and self.p_holm == self.p_holm and self.p_holm < statistics.SIGNIFICANCE

    @property
    def equivalent(self) -> bool:
        """Within its hypothesis's margin by the two one-sided tests, Holm-adjusted (and no difference)."""
        held = self.p_equivalence_holm is not None and self.p_equivalence_holm < statistics.SIGNIFICANCE
        return held and not self.significant and not self.not_judged


def _difference(configuration: Configuration, reference: Configuration, metric: str, alternative: str = "two-sided"):
    arm, base = configuration.values(metric), reference.values(metric)
    return statistics.difference(arm, base, alternative) if arm and base else None


def table_rows(
    configurations: list[Configuration], metrics: list[str], references: list[Configuration]
) -> list[Compared]:
    """Each configuration against each reference, metric by metric; a pair compared both ways (each a
    reference) appears twice but is one comparison."""
    return [
        Compared(metric, reference, configuration, _difference(configuration, reference, metric), None)
        for metric in metrics
        for reference in references
        for configuration in configurations
        if configuration is not reference
    ]


def not_learned(configuration: Configuration) -> str:
    """Why ``configuration`` did not learn (its runs' mean ``val/acc_best`` not above
    :data:`~capsexp.records.metric_names.LEARNED_OVER_CHANCE` times chance, the classes read from its first
    run's composed config), or "" (learned, or unknown)."""
    classes = classes_of(configuration.runs[0])
    values = [value for _, value in configuration.values(VAL_ACC_BEST)]
    if not classes or not values:
        return ""
    mean = sum(values) / len(values)
    if learned(mean, classes):
        return ""
    return (
        f"{configuration.label} did not learn ({VAL_ACC_BEST} {100 * mean:.1f}% over its {len(values)} runs, "
        f"chance {100 / classes:.0f}%)"
    )


def classes_of(run: Run) -> int | None:
    """The classes of the run's data (``geometry.num_classes`` of its composed config); None unrecorded."""
    return _classes(run.folder / RUN_CONFIG)


@functools.cache  # a page asks it of the same runs for each hypothesis and each row of its figure
def _classes(config: Path) -> int | None:
    if not config.exists():
        return None
    classes = (yaml.safe_load(config.read_text()) or {}).get("geometry", {}).get("num_classes")
    return classes if isinstance(classes, int) and classes > 0 else None


def hypothesis_rows(configurations: list[Configuration], page: StudyPage) -> list[Compared]:
    """The page's declared hypotheses, each tested in its direction (None where the runs lack an arm); a
    hypothesis of an arm that did not learn is not judged (:func:`not_learned`), whatever its test gives."""
    rows = []
    for hypothesis in page.hypotheses:
        arm, reference = find(configurations, hypothesis.arm), find(configurations, hypothesis.reference)
        if arm is None or reference is None:
            continue
        found = _difference(arm, reference, hypothesis.metric, hypothesis.direction)
        equivalent = _equivalence(arm, reference, hypothesis) if hypothesis.margin is not None else None
        reason = hypothesis.not_judged or not_learned(arm) or not_learned(reference)
        rows.append(Compared(hypothesis.metric, reference, arm, found, None, hypothesis, equivalent, not_judged=reason))
    return rows


def _equivalence(
    configuration: Configuration, reference: Configuration, hypothesis: Hypothesis
) -> statistics.Equivalence | None:
    """Two one-sided tests of the seed-paired differences against the hypothesis's margin (in the metric's
    own units); None with fewer than two seeds run by both."""
    arm, base = dict(configuration.values(hypothesis.metric)), dict(reference.values(hypothesis.metric))
    seeds = sorted(seed for seed in arm.keys() & base.keys() if seed is not None)
    if len(seeds) < 2:
        return None
    paired = [arm[seed] - base[seed] for seed in seeds]
    return statistics.equivalence(paired, hypothesis.margin / scale(hypothesis.metric))


def distinct(row: Compared) -> frozenset:
    """What makes two rows one comparison: the metric and the pair, in either order."""
    return frozenset((row.metric, frozenset((row.reference.label, row.configuration.label))))


def family(configurations: list[Configuration], metrics: list[str], page: StudyPage) -> list[Compared]:
    """The page's comparisons with their family-adjusted p-values: the declared hypotheses (one family, or
    the families they declare) followed by the table's rows (exploratory: no p-value), or, with no
    hypotheses declared, the table's rows, every tested one in the family (a pair compared both ways
    counted once)."""
    references = references_of(configurations, page)
    rows = table_rows(configurations, metrics, references) if page.differences else []
    declared = hypothesis_rows(configurations, page)
    if page.hypotheses:
        families = [row.hypothesis.family for row in declared]
        adjusted = statistics.holm_within([row.p for row in declared], families)
        equivalent = statistics.holm_within(
            [row.equivalence.p if row.equivalence else None for row in declared], families
        )
        held = [_with(row, p, q) for row, p, q in zip(declared, adjusted, equivalent, strict=True)]
        return held + rows
    adjusted = statistics.holm_adjusted([row.p for row in rows], [distinct(row) for row in rows])
    return [_with(row, p) for row, p in zip(rows, adjusted, strict=True)]


def _with(row: Compared, p_holm: float | None, p_equivalence_holm: float | None = None) -> Compared:
    return replace(row, p_holm=p_holm, p_equivalence_holm=p_equivalence_holm)


def family_size(rows: list[Compared]) -> int:
    """How many p-values a family adjusts: its distinct tested comparisons (declared hypotheses in
    families of their own: the largest family's)."""
    families: dict[str, set] = {}
    for row in rows:
        if _tested(row):
            family = families.setdefault(row.hypothesis.family if row.hypothesis else "", set())
            family.add(distinct(row) if row.hypothesis is None else id(row))
    return max(map(len, families.values()), default=0)


def family_count(rows: list[Compared]) -> int:
    """How many families the declared hypotheses among ``rows`` form (1 for a page of one family)."""
    return len({row.hypothesis.family for row in rows if row.hypothesis is not None and _tested(row)})


def _tested(row: Compared) -> bool:
    return row.p_holm is not None and not math.isnan(row.p_holm)


def both_adjusted(rows: list[Compared]) -> dict[int, tuple[float | None, float | None]]:
    """Each declared hypothesis's t-test and permutation p-values, each adjusted by Holm over the
    hypotheses of its family (by ``id`` of its row)."""
    families = [r.hypothesis.family if r.hypothesis else "" for r in rows]
    t = statistics.holm_within([r.difference.p if r.difference else None for r in rows], families)
    permuted = statistics.holm_within([r.difference.p_permutation if r.difference else None for r in rows], families)
    return {id(row): pair for row, *pair in zip(rows, t, permuted, strict=True)}


def permutation_adjusted(rows: list[Compared]) -> list[float | None]:
    """The permutation tests' p-values of the table's ``rows``, one a row, adjusted by Holm over the same
    comparisons as its t-tests' (a pair compared both ways counted once); None where a row is not tested."""
    return statistics.holm_adjusted(
        [
            row.difference.p_permutation if row.difference is not None and row.difference.tested else None
            for row in rows
        ],
        [distinct(row) for row in rows],
    )


def permutation_floor(rows: list[Compared]) -> float:
    """The smallest p-value the exact permutation test can give any of the tested ``rows``: 2 / 2^n for n
    paired seeds (unpaired: 2 / C(n + m, n)), at the best-seeded row."""
    floors = []
    for row in rows:
        arm, reference = row.difference.runs
        paired = row.difference.test == statistics.PAIRED
        floors.append(2 / 2**arm if paired else 2 / math.comb(arm + reference, arm))
    return min(floors)


def verdict(row: Compared, permutation_holm: float | None, exploratory: bool = False) -> str:
    """Whether the runs support a declared hypothesis, or show it equivalent to none within its margin, or
    cannot tell at this power (with the difference the seeds could detect at their observed spread).
    ``exploratory``: the hypotheses were declared after some of their runs were seen, or their runs mix
    code or machines, so a test that reaches the level finds a difference (or an equivalence) to confirm,
    not a supported hypothesis."""
    hypothesis, found = row.hypothesis, row.difference
    if row.not_judged:
        return f"not judged: {row.not_judged}"
    if not found.tested:
        return "too few seeds to test" if found.too_few_to_test else "not tested (no spread)"
    factor = scale(hypothesis.metric)
    detectable = (
        ""
        if found.detectable is None
        else f"; detectable at the observed spread: {factor * found.detectable:.{places(factor)}f}"
    )
    if row.significant:
        side = "above" if found.mean > 0 else "below"
        text = (
            f"a difference (exploratory): the arm is {side} its reference"
            if exploratory
            else f"**supported**: the arm is {side} its reference"
        )
        if hypothesis.test == "t" and not (permutation_holm is not None and permutation_holm < statistics.SIGNIFICANCE):
            text += " (on the t-test alone: the permutation test does not reach the level)"
        return text
    if hypothesis.margin is not None:
        if row.equivalent:
            held = f"two one-sided tests, Holm p {row.p_equivalence_holm:.2g}"
            if exploratory:
                return f"within ±{hypothesis.margin:g} (exploratory; {held})"
            return f"**equivalent** within ±{hypothesis.margin:g} ({held})"
        return (
            f"cannot tell at this power: neither a difference nor equivalence within ±{hypothesis.margin:g}{detectable}"
        )
    return f"cannot tell at this power: no difference found, and no margin declared to test for none{detectable}"
