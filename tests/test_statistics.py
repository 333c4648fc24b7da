"""The statistics of a comparison against cases computed by hand: Student's t with 2 degrees of
freedom has the closed form F(t) = 1/2 + t / (2 sqrt(2 + t^2)), and t_{0.975, 2} = 4.302653."""

from __future__ import annotations

import math

import pytest

from capsexp.results.statistics import (
    PAIRED,
    REPRODUCTION_FLOOR,
    WELCH,
    detectable_difference,
    difference,
    holm_adjusted,
    relabelling_p,
    reproduction_tolerance,
    sign_flip_p,
    summarise,
)

T_975_DF2 = 4.302653


def two_sided_p_df2(t: float) -> float:
    return 2 * (1 - (0.5 + abs(t) / (2 * math.sqrt(2 + t * t))))


def test_a_configurations_interval_is_the_student_t_interval_of_its_mean():
    summary = summarise([1.0, 2.0, 3.0])  # mean 2, std 1, standard error 1 / sqrt(3)
    assert (summary.n, summary.mean, summary.std) == (3, 2.0, 1.0)
    half = T_975_DF2 / math.sqrt(3)
    assert (summary.low, summary.high) == pytest.approx((2 - half, 2 + half), abs=1e-6)
    one = summarise([0.97])
    assert (one.n, one.mean, one.std, one.low, one.high) == (1, 0.97, None, None, None)  # no spread from one run
    same = summarise([0.5, 0.5])
    assert (same.std, same.low, same.high) == (0.0, 0.5, 0.5)


def logit_t_interval(values: list[float], top: float = 1.0) -> tuple[float, float]:
    """By hand: the t interval of the mean of log(p / (1 - p)), p = value / top, mapped back by 1 / (1 + e^-x)."""
    from scipy import stats

    logits = [math.log((v / top) / (1 - v / top)) for v in values]
    n = len(logits)
    mean = sum(logits) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in logits) / (n - 1))
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return top / (1 + math.exp(-(mean - half))), top / (1 + math.exp(-(mean + half)))


@pytest.mark.parametrize(
    "values",
    [[0.9547, 0.9703], [0.912, 0.95, 0.986], [0.31, 0.58, 0.44, 0.72, 0.49]],  # 2 seeds near 100 %, 3, 5 seeds
)
def test_an_accuracys_interval_is_the_t_interval_of_its_logits_and_stays_within_0_and_100(values):
    """The mean and std as they are (the plain ones), the interval the t interval of the logits mapped back:
    two seeds at 95.47 and 97.03 % would get [86.3, 106.2] by the plain t interval."""
    from scipy import stats

    summary = summarise(values, (0.0, 1.0))
    n, mean = len(values), sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    assert (summary.n, summary.mean, summary.std) == (n, pytest.approx(mean, abs=1e-12), pytest.approx(std))
    low, high = logit_t_interval(values)
    assert (summary.low, summary.high) == (pytest.approx(low, abs=1e-9), pytest.approx(high, abs=1e-9))
    assert 0 < summary.low < mean < summary.high < 1
    in_percent = summarise([100 * v for v in values], (0.0, 100.0))  # the same interval, in %
    assert (in_percent.low, in_percent.high) == (pytest.approx(100 * low, abs=1e-7), pytest.approx(100 * high))
    plain = summarise(values)  # unbounded: the t interval of the values
    plain_half = stats.t.ppf(0.975, n - 1) * std / math.sqrt(n)
    assert (plain.low, plain.high) == (pytest.approx(mean - plain_half), pytest.approx(mean + plain_half))
    if n == 2:
        assert plain.high > 1 > summary.high  # what the bounded interval is for


def test_an_accuracy_on_its_edge_has_no_logit_and_gets_the_t_interval_cut_to_the_range():
    from scipy import stats

    values = [1.0, 0.98, 0.995]  # one run at 100 %
    mean = sum(values) / 3
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)
    half = stats.t.ppf(0.975, 2) * std / math.sqrt(3)
    summary = summarise(values, (0.0, 1.0))
    assert (summary.low, summary.high) == (pytest.approx(mean - half), 1.0)
    assert mean + half > 1  # cut
    assert summarise([0.0, 0.02], (0.0, 1.0)).low == 0.0


def t_sf(t: float, df: int) -> float:
    """P(T > t) for Student's t by numerical integration of its density (no scipy.stats)."""
    from scipy import integrate

    def density(x: float) -> float:
        scale = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
        return scale * (1 + x * x / df) ** (-(df + 1) / 2)

    return integrate.quad(density, t, math.inf)[0]


def test_arms_that_share_their_seeds_are_compared_by_a_paired_t_test_and_a_sign_flip_test():
    # per-seed differences 0.01, 0.03, 0.02, 0.04, 0.05: mean 0.03, sd 0.0158, t = 0.03 / (sd / sqrt 5)
    arm = [(1, 0.91), (2, 0.95), (3, 0.92), (4, 0.97), (5, 0.96)]
    reference = [(3, 0.90), (1, 0.90), (5, 0.91), (2, 0.92), (4, 0.93)]  # order does not matter: pairs by seed
    result = difference(arm, reference)
    sd = math.sqrt(sum((d - 0.03) ** 2 for d in (0.01, 0.03, 0.02, 0.04, 0.05)) / 4)
    t = 0.03 / (sd / math.sqrt(5))
    assert result.test == PAIRED and result.runs == (5, 5)
    assert result.mean == pytest.approx(0.03)
    assert result.p == pytest.approx(2 * t_sf(t, 4), abs=1e-7)
    # Every difference positive: of the 32 sign flips only all-plus and all-minus reach |mean| 0.03.
    assert result.p_permutation == pytest.approx(2 / 32)
    assert difference(arm, reference, "greater").p_permutation == pytest.approx(1 / 32)
    assert difference(arm, reference, "greater").p == pytest.approx(t_sf(t, 4), abs=1e-7)
    assert difference(arm, reference, "less").p == pytest.approx(1 - t_sf(t, 4), abs=1e-7)
    # Unpaired, the same numbers give Welch's larger p: the seeds' shared luck is not removed.
    assert difference([(s + 10, v) for s, v in arm], reference).p > result.p


def test_three_seeds_get_an_interval_and_no_test():
    # per-seed differences 0.01, 0.02, 0.03: mean 0.02, sd 0.01
    arm = [(1, 0.90), (2, 0.92), (3, 0.95)]
    reference = [(3, 0.92), (1, 0.89), (2, 0.90)]
    result = difference(arm, reference)
    half = T_975_DF2 * 0.01 / math.sqrt(3)
    assert (result.low, result.high) == pytest.approx((0.02 - half, 0.02 + half), abs=1e-6)
    assert (result.p, result.p_permutation, result.detectable) == (None, None, None)
    assert result.too_few_to_test and not result.tested


def test_the_sign_flip_test_counts_flips_reaching_the_observed_mean():
    # differences -1, 2, 3, 4, 5 (sum 13): a flip of the subset S gives |15 - 2 sum(S)|, at least 13 for
    # sum(S) in {0, 1, 14, 15}: 4 of 32. One-sided (sum >= 13): sum(S) in {0, 1}, 2 of 32.
    assert sign_flip_p([-1, 2, 3, 4, 5]) == pytest.approx(4 / 32)
    assert sign_flip_p([-1, 2, 3, 4, 5], "greater") == pytest.approx(2 / 32)
    assert sign_flip_p([-1, 2, 3, 4, 5], "less") == pytest.approx(31 / 32)


def test_the_relabelling_test_counts_splits_reaching_the_observed_difference():
    # 5, 6, 7 against 1, 2, 3: of the 20 splits of six runs into threes, only these two reach |4|.
    assert relabelling_p([5, 6, 7], [1, 2, 3]) == pytest.approx(2 / 20)
    assert relabelling_p([5, 6, 7], [1, 2, 3], "greater") == pytest.approx(1 / 20)
    # Unequal groups, 5, 6 against 1, 2, 3 (difference of means 3.5): of the 10 ways to pick two of the
    # five runs as the arm, only {5, 6} reaches |3.5| ({1, 2} comes nearest: 1.5 - 14/3 = -3.17).
    assert relabelling_p([5, 6], [1, 2, 3]) == pytest.approx(1 / 10)


def test_the_detectable_difference_is_found_with_the_stated_power():
    """Simulated: paired differences of 5 seeds at the detectable mean, the t-test at 0.05 two-sided."""
    import numpy as np

    error = 0.4  # the standard error of the mean difference: sd 0.4 sqrt 5
    delta = detectable_difference(error, 4)
    rng = np.random.default_rng(1)
    draws = rng.normal(delta, error * math.sqrt(5), size=(40_000, 5))
    t = draws.mean(axis=1) / (draws.std(axis=1, ddof=1) / math.sqrt(5))
    assert np.mean(np.abs(t) > 2.776445) == pytest.approx(0.8, abs=0.01)
    assert detectable_difference(error, 4) > detectable_difference(error, 40)  # fewer seeds, larger


def test_arms_with_other_seeds_are_compared_by_welchs_t_test():
    # [1, 3] against [5, 7]: variances 2 and 2, n = 2 each; Welch's df = (1 + 1)^2 / (1 + 1) = 2,
    # t = (2 - 6) / sqrt(2 / 2 + 2 / 2) = -2 sqrt 2: an interval, and too few runs to test.
    result = difference([(1, 1.0), (2, 3.0)], [(3, 5.0), (4, 7.0)])
    assert result.test == WELCH
    assert result.mean == -4.0 and result.p is None
    half = T_975_DF2 * math.sqrt(2)
    assert (result.low, result.high) == pytest.approx((-4 - half, -4 + half), abs=1e-5)
    five = difference(
        [(s, v) for s, v in enumerate((1.0, 3.0, 2.0, 4.0, 2.5))],
        [(s + 9, v) for s, v in enumerate((5.0, 7.0, 6.0, 6.5, 5.5))],
    )
    assert five.test == WELCH and five.p < 0.01 and five.p_permutation == pytest.approx(2 / 252)
    # The same seeds but one of them twice on a side: no pairing either.
    assert difference([(1, 1.0), (1, 3.0)], [(1, 5.0), (2, 7.0)]).test == WELCH
    # The reference's seed twice, the arm's seeds the same set: not paired (a run would be dropped).
    twice = difference([(1, 0.9), (2, 0.8), (3, 0.85)], [(1, 0.7), (1, 0.75), (2, 0.6), (3, 0.65)])
    assert twice.test == WELCH and twice.runs == (3, 4)
    # Runs without a seed override cannot be paired.
    assert difference([(None, 1.0), (None, 3.0)], [(None, 5.0), (None, 7.0)]).test == WELCH


def test_too_few_runs_or_no_spread_give_no_test():
    single = difference([(1, 0.9)], [(1, 0.8), (2, 0.82)])
    assert (single.mean, single.test, single.p, single.low) == (pytest.approx(0.09), None, None, None)
    constant = difference([(s, 0.9) for s in range(5)], [(s, 0.8) for s in range(5)])  # every difference 0.1
    assert constant.test == PAIRED and math.isnan(constant.p) and constant.low == pytest.approx(0.1)


def test_holms_step_down_adjustment():
    # sorted 0.01, 0.03, 0.04 of m = 3: 3 x 0.01 = 0.03; 2 x 0.03 = 0.06; max(0.06, 1 x 0.04) = 0.06
    adjusted = holm_adjusted([0.01, 0.04, 0.03, None, math.nan])
    assert adjusted[:4] == pytest.approx([0.03, 0.06, 0.06, None]) and math.isnan(adjusted[4])
    assert holm_adjusted([0.6, 0.7]) == [1.0, 1.0]  # capped at 1
    assert holm_adjusted([]) == []


def test_holm_counts_the_p_values_of_one_key_once_and_gives_each_the_tests_adjusted_value():
    # keys a, b, a: m = 2 (a with its first p, 0.01): 2 x 0.01 = 0.02, max(0.02, 0.04) = 0.04
    assert holm_adjusted([0.01, 0.04, 0.3], ["a", "b", "a"]) == pytest.approx([0.02, 0.04, 0.02])
    assert holm_adjusted([None, 0.02], ["a", "a"]) == [None, None]  # the first of a key is its test
    with pytest.raises(ValueError):
        holm_adjusted([0.01], ["a", "b"])


def test_a_reproduction_tolerance_is_two_standard_errors_of_a_difference_of_means_with_a_floor():
    # 3 seeds of std 1.63 points: 2 x 1.63 x sqrt(2/3) = 2.66 points
    assert reproduction_tolerance(0.0163, 3) == pytest.approx(0.02662, abs=1e-5)
    assert reproduction_tolerance(0.0003, 3) == REPRODUCTION_FLOOR  # 3 seeds that happened to agree
    # A re-run of one seed against a mean of 3: 2 x 0.52 x sqrt(1/3 + 1) = 1.20 points, not 0.85.
    assert reproduction_tolerance(0.0052, 3, rerun=1) == pytest.approx(0.01201, abs=1e-5)
    assert reproduction_tolerance(0.0052, 3) == pytest.approx(0.00849, abs=1e-5)
    with pytest.raises(ValueError, match="a spread needs two runs at least, not 1"):
        reproduction_tolerance(0.01, 1)


def test_an_equivalence_test_is_two_one_sided_t_tests_against_the_margin():
    """Schuirmann's TOST, transcribed through scipy's one-sample t-test: the larger of the one-sided p-values
    of the differences against -margin (alternative: above) and +margin (alternative: below)."""
    from scipy import stats as scipy_stats

    from capsexp.results.statistics import equivalence

    cases = [([0.05, -0.10, 0.12, 0.02, -0.04], 0.3), ([0.21, 0.35, 0.18, 0.29, 0.40], 0.3), ([0.4, -0.6, 0.9], 0.5)]
    for differences, margin in cases:
        got = equivalence(differences, margin)
        above = scipy_stats.ttest_1samp(differences, -margin, alternative="greater").pvalue
        below = scipy_stats.ttest_1samp(differences, margin, alternative="less").pvalue
        assert got.p == pytest.approx(max(above, below), rel=1e-9)
        interval = scipy_stats.ttest_1samp(differences, 0).confidence_interval(0.95)
        assert (got.low, got.high) == pytest.approx((interval.low, interval.high), rel=1e-9)
        assert got.mean == pytest.approx(sum(differences) / len(differences)) and got.n == len(differences)
    inside, beyond, wide = (equivalence(d, m) for d, m in cases)
    assert inside.inside and inside.p < 0.05
    assert not beyond.inside and 0.05 < beyond.p < 0.5  # the mean, 0.286, just inside the margin
    assert not wide.inside  # a mean of 0.23 inside the margin, but three seeds spread too far
    assert equivalence([0.1, 0.1], 0.3).p == 0 and equivalence([0.4, 0.4], 0.3).p == 1  # no spread
    with pytest.raises(ValueError, match="two paired differences"):
        equivalence([0.1], 0.3)
