"""The statistics of a comparison (scipy's): a configuration's mean, standard deviation and confidence
interval over its seeds, and its difference from a reference configuration with a t-test, paired when
the two share their seeds, Welch's otherwise, the p-values adjusted by Holm's method when several
configurations are compared with one reference."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95  # of every interval a comparison gives
SIGNIFICANCE = 0.05  # the family-wise level below which an adjusted p-value is called significant

PAIRED, WELCH = "paired t", "Welch t"


@dataclass(frozen=True)
class Summary:
    """A configuration's values over its runs: their number, mean, sample standard deviation and the
    Student-t confidence interval of the mean (no std or interval for a single run)."""

    n: int
    mean: float
    std: float | None = None
    low: float | None = None
    high: float | None = None

    def text(self, factor: float = 1.0) -> str:
        """``mean ± std`` (times ``factor``: 100 for %), the mean alone for one run."""
        if self.std is None:
            return f"{factor * self.mean:.2f}"
        return f"{factor * self.mean:.2f} ± {factor * self.std:.2f}"


def summarise(values: Sequence[float]) -> Summary:
    """mean ± t_{n-1} s / sqrt(n) at :data:`CONFIDENCE`."""
    from scipy import stats

    n, mean = len(values), statistics.fmean(values)
    if n < 2:
        return Summary(n, mean)
    std = statistics.stdev(values)
    if std == 0:
        return Summary(n, mean, 0.0, mean, mean)
    low, high = stats.t.interval(CONFIDENCE, n - 1, loc=mean, scale=std / math.sqrt(n))
    return Summary(n, mean, std, float(low), float(high))


@dataclass(frozen=True)
class Difference:
    """A configuration minus the reference: the mean difference, its confidence interval and the test's
    two-sided p-value (``test`` None: too few runs for one; ``p`` NaN: no spread in either arm);
    ``p_holm`` is set by :func:`holm_adjusted`."""

    mean: float
    test: str | None = None
    low: float | None = None
    high: float | None = None
    p: float | None = None
    p_holm: float | None = None


def difference(arm: Sequence[tuple[int | None, float]], reference: Sequence[tuple[int | None, float]]) -> Difference:
    """``arm`` minus ``reference``, each a list of ``(seed, value)`` of its runs. When both sides ran
    the same seeds, once each, the runs are paired by seed (a seed fixes initialisation and data order,
    so a seed's runs share their luck): a paired t-test over the per-seed differences. Otherwise
    Welch's t-test, which does not assume equal variances. Either needs two runs a side."""
    from scipy import stats

    arm_values, reference_values = [v for _, v in arm], [v for _, v in reference]
    mean = statistics.fmean(arm_values) - statistics.fmean(reference_values)
    if len(arm) < 2 or len(reference) < 2:
        return Difference(mean)
    arm_by_seed, reference_by_seed = dict(arm), dict(reference)
    paired = (
        None not in arm_by_seed
        and len(arm_by_seed) == len(arm)
        and len(reference_by_seed) == len(reference)
        and set(arm_by_seed) == set(reference_by_seed)
    )
    if paired:
        seeds = sorted(arm_by_seed)
        pairs = [arm_by_seed[s] for s in seeds], [reference_by_seed[s] for s in seeds]
        test, constant = PAIRED, _constant([a - r for a, r in zip(*pairs, strict=True)])
    else:
        test, constant = WELCH, _constant(arm_values) and _constant(reference_values)
    if constant:  # every difference equal (paired) or both arms constant: no spread to test against
        return Difference(mean, test, p=math.nan)
    if paired:
        result = stats.ttest_rel(*pairs)
    else:
        result = stats.ttest_ind(arm_values, reference_values, equal_var=False)
    p = float(result.pvalue)
    interval = result.confidence_interval(CONFIDENCE)
    return Difference(mean, test, float(interval.low), float(interval.high), p)


def _constant(values: Sequence[float]) -> bool:
    """All equal up to rounding (accuracies logged as float32 differ in their last bits)."""
    return max(values) - min(values) <= 1e-9 * max(1.0, *map(abs, values))


def holm_adjusted(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's (1979) step-down adjustment of m p-values: the k-th smallest becomes
    max over j <= k of min(1, (m - j + 1) p_(j)); it keeps the chance of any false "significant"
    among the m comparisons below the level. None (no test) and NaN (no spread) are not counted."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if p is not None and not math.isnan(p))
    adjusted: list[float | None] = list(p_values)
    running = 0.0
    for rank, (p, index) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[index] = running
    return adjusted


# No reproduction check tighter than this (a fraction: 0.2 points, 10 of 5,000 validation digits): two or
# three seeds can give a std far below the seeds' true spread.
REPRODUCTION_FLOOR = 0.002


def reproduction_tolerance(std: float, runs: int, rerun: int | None = None) -> float:
    """How far a re-run's mean over ``rerun`` seeds (default: as many as the committed figure's) may fall
    from a committed mean over ``runs`` seeds with standard deviation ``std``: twice the standard error
    of the difference of the two means, 2 std sqrt(1 / runs + 1 / rerun), and at least
    :data:`REPRODUCTION_FLOOR`."""
    if runs < 2:
        raise ValueError(f"a spread needs two runs at least, not {runs}")
    rerun = runs if rerun is None else rerun
    if rerun < 1:
        raise ValueError(f"a re-run has one run at least, not {rerun}")
    return max(2 * std * math.sqrt(1 / runs + 1 / rerun), REPRODUCTION_FLOOR)


@dataclass(frozen=True)
class Equivalence:
    """Paired differences against an equivalence margin: their mean, its :data:`CONFIDENCE` interval, and
    the p-value of two one-sided t-tests (Schuirmann 1987), the larger of the tests of mean <= -margin and
    of mean >= +margin: below a level, the mean difference is within the margin at that level."""

    n: int
    mean: float
    low: float
    high: float
    p: float
    margin: float

    @property
    def inside(self) -> bool:
        """The interval lies within (-margin, +margin)."""
        return -self.margin < self.low and self.high < self.margin


def equivalence(differences: Sequence[float], margin: float) -> Equivalence:
    """Two one-sided tests of paired ``differences`` (one per seed) against ``-margin`` and ``+margin``;
    needs two differences at least. Differences all equal: their mean is known exactly (p 0 inside the
    margin, 1 outside)."""
    from scipy import stats

    n = len(differences)
    if n < 2:
        raise ValueError(f"an equivalence test needs two paired differences at least, not {n}")
    if margin <= 0:
        raise ValueError(f"an equivalence margin is positive, not {margin}")
    mean = statistics.fmean(differences)
    if _constant(differences):
        return Equivalence(n, mean, mean, mean, 0.0 if abs(mean) < margin else 1.0, margin)
    error = statistics.stdev(differences) / math.sqrt(n)
    above_lower = stats.t.sf((mean + margin) / error, n - 1)  # H0: mean <= -margin
    below_upper = stats.t.cdf((mean - margin) / error, n - 1)  # H0: mean >= +margin
    low, high = stats.t.interval(CONFIDENCE, n - 1, loc=mean, scale=error)
    return Equivalence(n, mean, float(low), float(high), float(max(above_lower, below_upper)), margin)
