"""The statistics of a comparison (scipy's): a configuration's mean, standard deviation and confidence
interval over its seeds, and its difference from a reference configuration with its interval; with
:data:`MIN_RUNS_TO_TEST` runs a side or more, a t-test (paired when the two share their seeds, Welch's
otherwise), an exact permutation test beside it that assumes no normality, and the smallest difference
the seeds could detect. A page's p-values are adjusted together by Holm's method (one family a page)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95  # of every interval a comparison gives
SIGNIFICANCE = 0.05  # the family-wise level below which an adjusted p-value is called significant
# A comparison is tested only with this many runs a side: the fewest on which a reader can see that the
# per-seed differences agree. The t-test still assumes their normality; the exact permutation test beside it
# does not, but cannot go below 2 / 2^n two-sided (5 paired seeds: 0.0625, so never below SIGNIFICANCE).
MIN_RUNS_TO_TEST = 5
POWER = 0.8  # of the smallest detectable difference a comparison states
EXACT_FLIPS_UP_TO = 12  # paired runs up to which the permutation test enumerates every sign flip (4,096)
RANDOM_PERMUTATIONS = 20_000  # drawn (seeded) where enumerating would take longer

PAIRED, WELCH = "paired t", "Welch t"


# What the interval of a mean of proportions (accuracies) is, as the pages name it (summarise with bounds).
BOUNDED_INTERVAL = (
    "Student's t on the logit scale, mapped back into 0-100 %; cut to that range where a run scored 0 or 100 %"
)


@dataclass(frozen=True)
class Summary:
    """A configuration's values over its runs: their number, mean, sample standard deviation and the
    confidence interval of the mean (:func:`summarise`; no std or interval for a single run)."""

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


def summarise(values: Sequence[float], bounds: tuple[float, float] | None = None) -> Summary:
    """The mean and sample std of ``values`` and the interval of the mean at :data:`CONFIDENCE`:
    mean ± t_{n-1} s / sqrt(n). ``bounds`` ``(low, high)``: the values are proportions of that range
    (accuracies: ``(0, 1)``, or ``(0, 100)`` in %), whose mean's interval must not leave it; the t interval
    is then taken of their logits and mapped back (:data:`BOUNDED_INTERVAL`). A symmetric interval of a
    mean near 100 % with few runs reaches far past it (two runs: t_1 = 12.7 standard errors)."""
    from scipy import special, stats

    n, mean = len(values), statistics.fmean(values)
    if n < 2:
        return Summary(n, mean)
    std = statistics.stdev(values)
    if std == 0:
        return Summary(n, mean, 0.0, mean, mean)
    if bounds is None:
        low, high = stats.t.interval(CONFIDENCE, n - 1, loc=mean, scale=std / math.sqrt(n))
        return Summary(n, mean, std, float(low), float(high))
    bottom, top = bounds
    shares = [(v - bottom) / (top - bottom) for v in values]
    if min(shares) <= 0 or max(shares) >= 1:  # a run on an edge has no logit
        low, high = stats.t.interval(CONFIDENCE, n - 1, loc=mean, scale=std / math.sqrt(n))
        return Summary(n, mean, std, float(max(low, bottom)), float(min(high, top)))
    logits = special.logit(shares)
    low, high = stats.t.interval(
        CONFIDENCE, n - 1, loc=statistics.fmean(logits), scale=statistics.stdev(logits) / math.sqrt(n)
    )
    return Summary(
        n,
        mean,
        std,
        float(bottom + (top - bottom) * special.expit(low)),
        float(bottom + (top - bottom) * special.expit(high)),
    )


@dataclass(frozen=True)
class Difference:
    """A configuration minus the reference: the mean difference and its confidence interval (``test``
    names the interval's method; None: one run a side), and with :data:`MIN_RUNS_TO_TEST` runs a side
    the t-test's two-sided p-value, the exact permutation test's (``p_permutation``) and the smallest
    difference the runs could detect (``detectable``: at :data:`POWER`, the observed spread, level
    :data:`SIGNIFICANCE` unadjusted). ``p`` None: not tested (``runs`` says how many a side); NaN: no
    spread to test against."""

    mean: float
    test: str | None = None
    low: float | None = None
    high: float | None = None
    p: float | None = None
    p_permutation: float | None = None
    detectable: float | None = None
    runs: tuple[int, int] = (0, 0)  # the arm's and the reference's

    @property
    def tested(self) -> bool:
        return self.p is not None

    @property
    def too_few_to_test(self) -> bool:
        """An interval without a test: fewer than :data:`MIN_RUNS_TO_TEST` runs on a side."""
        return self.test is not None and min(self.runs) < MIN_RUNS_TO_TEST


ALTERNATIVES = ("two-sided", "greater", "less")  # what a test's p-value is against: scipy's names


def difference(
    arm: Sequence[tuple[int | None, float]],
    reference: Sequence[tuple[int | None, float]],
    alternative: str = "two-sided",
) -> Difference:
    """``arm`` minus ``reference``, each a list of ``(seed, value)`` of its runs. When both sides ran
    the same seeds, once each, the runs are paired by seed (a seed fixes initialisation and data order,
    so a seed's runs share their luck): the interval and t-test of the per-seed differences, and the
    sign-flip permutation test (:func:`sign_flip_p`). Otherwise Welch's, which does not assume equal
    variances, and the two-sample permutation test (:func:`relabelling_p`). An interval needs two runs a
    side; a test :data:`MIN_RUNS_TO_TEST`. ``alternative`` (:data:`ALTERNATIVES`) is the tests'
    direction, ``greater``: the arm above the reference; the interval is two-sided whatever it is."""
    from scipy import stats

    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {', '.join(ALTERNATIVES)}, not {alternative!r}")

    arm_values, reference_values = [v for _, v in arm], [v for _, v in reference]
    mean = statistics.fmean(arm_values) - statistics.fmean(reference_values)
    runs = (len(arm), len(reference))
    if min(runs) < 2:
        return Difference(mean, runs=runs)
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
        return Difference(mean, test, mean, mean, math.nan if min(runs) >= MIN_RUNS_TO_TEST else None, runs=runs)
    if paired:
        result = stats.ttest_rel(*pairs)
    else:
        result = stats.ttest_ind(arm_values, reference_values, equal_var=False)
    interval = result.confidence_interval(CONFIDENCE)
    low, high = float(interval.low), float(interval.high)
    if min(runs) < MIN_RUNS_TO_TEST:
        return Difference(mean, test, low, high, runs=runs)
    if paired:
        differences = [a - r for a, r in zip(*pairs, strict=True)]
        p = stats.ttest_rel(*pairs, alternative=alternative).pvalue
        permuted = sign_flip_p(differences, alternative)
        detectable = detectable_difference(statistics.stdev(differences) / math.sqrt(len(differences)), len(arm) - 1)
    else:
        p = stats.ttest_ind(arm_values, reference_values, equal_var=False, alternative=alternative).pvalue
        permuted = relabelling_p(arm_values, reference_values, alternative)
        error = math.sqrt(
            statistics.variance(arm_values) / len(arm) + statistics.variance(reference_values) / len(reference)
        )
        detectable = detectable_difference(error, float(result.df))
    return Difference(mean, test, low, high, float(p), permuted, detectable, runs)


def _beyond(permuted, observed: float, alternative: str):
    """Which of the permuted statistics reach the observed one, in the test's direction (a relative
    tolerance: a flip that reproduces the observed mean must count, whatever its rounding)."""
    import numpy as np

    slack = 1e-12 * max(abs(observed), 1e-300)
    if alternative == "greater":
        return permuted >= observed - slack
    if alternative == "less":
        return permuted <= observed + slack
    return np.abs(permuted) >= abs(observed) - slack


def detectable_difference(error: float, df: float, power: float = POWER, level: float = SIGNIFICANCE) -> float:
    """The smallest true difference a two-sided t-test at ``level`` finds with probability ``power``,
    for a difference with standard error ``error`` on ``df`` degrees of freedom: the delta at which the
    noncentral t's mass beyond the critical values is ``power`` (Cohen 1988, ch. 2)."""
    from scipy import optimize, stats

    critical = stats.t.ppf(1 - level / 2, df)

    def shortfall(delta: float) -> float:
        shift = delta / error
        found = stats.nct.sf(critical, df, shift) + stats.nct.cdf(-critical, df, shift)
        if math.isnan(found):  # scipy's noncentral t fails far out in its tail (few df, a small level): the normal's
            found = stats.norm.sf(critical - shift) + stats.norm.cdf(-critical - shift)
        return found - power

    upper = critical * error  # power is about a half there: step up to where it passes ``power``
    while (short := shortfall(upper)) < 0:
        upper += error
    if math.isnan(short):  # scipy's noncentral t fails far out in its tail: the normal approximation
        return float((critical + stats.norm.ppf(power)) * error)
    return float(optimize.brentq(shortfall, 0.0, upper))


@dataclass(frozen=True)
class SeedPlan:
    """How many paired seeds a confirmatory comparison needs, and what decides it: ``for_power``, the
    t-test's (a difference of ``smallest_effect`` found with probability ``power`` at the Holm-adjusted level
    of the first of ``tests``); ``for_permutation``, the exact sign-flip test's (its smallest two-sided p,
    2 / 2^n, at or below that level); ``for_equivalence`` (None without a margin), two one-sided tests'
    (no true difference shown inside +-margin with probability ``power``). ``seeds``: the largest."""

    seeds: int
    for_power: int
    for_permutation: int
    for_equivalence: int | None
    level: float


PILOT_CONFIDENCE = 0.8  # of the upper bound a seed plan takes for a pilot's spread


def pilot_std_bound(std: float, runs: int, confidence: float = PILOT_CONFIDENCE) -> float:
    """The one-sided upper ``confidence`` bound of a spread estimated from a pilot of ``runs`` paired seeds,
    std * sqrt((n - 1) / chi2_{1 - confidence}(n - 1)): a plan made from it is not undone by a pilot that
    drew a small spread by chance (3 seeds: 2.12 times the estimate)."""
    from scipy import stats

    if runs < 2:
        raise ValueError(f"a pilot's spread needs two runs at least, not {runs}")
    return std * math.sqrt((runs - 1) / stats.chi2.ppf(1 - confidence, runs - 1))


def seeds_needed(
    paired_std: float,
    smallest_effect: float,
    tests: int = 1,
    margin: float | None = None,
    power: float = POWER,
    level: float = SIGNIFICANCE,
) -> SeedPlan:
    """The paired seeds (:class:`SeedPlan`) for differences of standard deviation ``paired_std`` across seeds
    (a pilot's), one test of a family of ``tests`` under Holm (its strictest level, ``level / tests``).
    Equivalence with the true difference 0: two one-sided t-tests each at that level, their power
    2 Phi(margin / se - t) - 1 with the standard error taken as known (Chow, Shao & Wang 2008, section 3.2)."""
    from scipy import stats

    if paired_std <= 0 or smallest_effect <= 0 or tests < 1:
        raise ValueError("a seed plan needs a positive spread and smallest effect, and one test at least")
    strictest = level / tests
    for_permutation = max(2, math.ceil(math.log2(2 / strictest)))
    n = 2
    while detectable_difference(paired_std / math.sqrt(n), n - 1, power, strictest) > smallest_effect:
        n += 1
    for_equivalence = None
    if margin is not None:
        m = 2
        while 2 * stats.norm.cdf(margin * math.sqrt(m) / paired_std - stats.t.ppf(1 - strictest, m - 1)) - 1 < power:
            m += 1
        for_equivalence = m
    seeds = max(n, for_permutation, for_equivalence or 0)
    return SeedPlan(seeds, n, for_permutation, for_equivalence, strictest)


def sign_flip_p(differences: Sequence[float], alternative: str = "two-sided") -> float:
    """The exact paired permutation test: under no effect each per-seed difference is as likely negative
    as positive, so the share of the 2^n sign flips whose mean reaches the observed one (in |mean| for
    a two-sided test) is the p-value (every flip for n <= :data:`EXACT_FLIPS_UP_TO`, a seeded draw of
    :data:`RANDOM_PERMUTATIONS` beyond). Its smallest two-sided value is 2 / 2^n: 0.0625 for 5 seeds
    (one-sided, 1 / 2^n)."""
    import itertools

    import numpy as np

    values = np.asarray(differences, dtype=np.float64)
    n = len(values)
    if n <= EXACT_FLIPS_UP_TO:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
    else:
        signs = np.random.default_rng(0).choice((1.0, -1.0), size=(RANDOM_PERMUTATIONS, n))
    return float(np.mean(_beyond(signs @ values / n, values.mean(), alternative)))


def relabelling_p(arm: Sequence[float], reference: Sequence[float], alternative: str = "two-sided") -> float:
    """The exact two-sample permutation test: the share of the ways to split the pooled runs into groups
    of the two sizes whose difference of means reaches the observed one (every split for up to 10,000 of
    them, a seeded draw of :data:`RANDOM_PERMUTATIONS` beyond)."""
    import itertools

    import numpy as np

    pooled = np.asarray([*arm, *reference], dtype=np.float64)
    size, total = len(arm), len(pooled)
    if math.comb(total, size) <= 10_000:
        masks = np.zeros((math.comb(total, size), total), dtype=bool)
        for row, chosen in enumerate(itertools.combinations(range(total), size)):
            masks[row, list(chosen)] = True
    else:
        rng = np.random.default_rng(0)
        masks = np.argsort(rng.random((RANDOM_PERMUTATIONS, total)), axis=1) < size
    sums = masks @ pooled
    gaps = sums / size - (pooled.sum() - sums) / (total - size)
    return float(np.mean(_beyond(gaps, pooled[:size].mean() - pooled[size:].mean(), alternative)))


def _constant(values: Sequence[float]) -> bool:
    """All equal up to rounding (accuracies logged as float32 differ in their last bits)."""
    return max(values) - min(values) <= 1e-9 * max(1.0, *map(abs, values))


def holm_adjusted(p_values: Sequence[float | None], keys: Sequence[Hashable] | None = None) -> list[float | None]:
    """Holm's (1979) step-down adjustment of m p-values: the k-th smallest becomes
    max over j <= k of min(1, (m - j + 1) p_(j)); it keeps the chance of any false "significant"
    among the m comparisons below the level. None (no test) and NaN (no spread) are not counted.
    ``keys``, one a p-value: those of one key are one test (a pair compared both ways), counted once
    with the first one's p-value, and each given that test's adjusted value. The one adjustment of every
    family: the pages' t-tests and permutation tests, the declared hypotheses, the precision page's."""
    if keys is not None:
        first: dict[Hashable, float | None] = {}
        for key, p in zip(keys, p_values, strict=True):
            first.setdefault(key, p)
        by_key = dict(zip(first, holm_adjusted(list(first.values())), strict=True))
        return [by_key[key] for key in keys]
    tested = sorted((p, i) for i, p in enumerate(p_values) if p is not None and not math.isnan(p))
    adjusted: list[float | None] = list(p_values)
    running = 0.0
    for rank, (p, index) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[index] = running
    return adjusted


def holm_within(p_values: Sequence[float | None], families: Sequence[Hashable]) -> list[float | None]:
    """:func:`holm_adjusted` within each family (``families``, one a p-value): each family's p-values
    adjusted over that family alone, as if each were its own page."""
    adjusted: list[float | None] = list(p_values)
    for family in dict.fromkeys(families):
        members = [i for i, f in enumerate(families) if f == family]
        for i, q in zip(members, holm_adjusted([p_values[i] for i in members]), strict=True):
            adjusted[i] = q
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
