"""The statistics of a comparison against cases computed by hand: Student's t with 2 degrees of
freedom has the closed form F(t) = 1/2 + t / (2 sqrt(2 + t^2)), and t_{0.975, 2} = 4.302653."""

from __future__ import annotations

import math

import pytest

from capsexp.results.statistics import (
    PAIRED,
    REPRODUCTION_FLOOR,
    WELCH,
    difference,
    holm_adjusted,
    reproduction_tolerance,
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


def test_arms_that_share_their_seeds_are_compared_by_a_paired_t_test():
    # per-seed differences 0.01, 0.02, 0.03: mean 0.02, sd 0.01, t = 0.02 / (0.01 / sqrt 3) = 2 sqrt 3
    arm = [(1, 0.90), (2, 0.92), (3, 0.95)]
    reference = [(3, 0.92), (1, 0.89), (2, 0.90)]  # order does not matter: pairs are made by seed
    result = difference(arm, reference)
    assert result.test == PAIRED
    assert result.mean == pytest.approx(0.02)
    assert result.p == pytest.approx(two_sided_p_df2(2 * math.sqrt(3)), abs=1e-9)  # 0.07418
    half = T_975_DF2 * 0.01 / math.sqrt(3)
    assert (result.low, result.high) == pytest.approx((0.02 - half, 0.02 + half), abs=1e-6)
    # Unpaired, the same numbers would give Welch's much larger p: the seeds' shared luck is removed.
    assert difference([(4, v) for _, v in arm], reference).p > 0.3


def test_arms_with_other_seeds_are_compared_by_welchs_t_test():
    # [1, 3] against [5, 7]: variances 2 and 2, n = 2 each; Welch's df = (1 + 1)^2 / (1 + 1) = 2,
    # t = (2 - 6) / sqrt(2 / 2 + 2 / 2) = -2 sqrt 2.
    result = difference([(1, 1.0), (2, 3.0)], [(3, 5.0), (4, 7.0)])
    assert result.test == WELCH
    assert result.mean == -4.0
    assert result.p == pytest.approx(two_sided_p_df2(2 * math.sqrt(2)), abs=1e-9)  # 0.10557
    half = T_975_DF2 * math.sqrt(2)
    assert (result.low, result.high) == pytest.approx((-4 - half, -4 + half), abs=1e-5)
    # The same seeds but one of them twice on a side: no pairing either.
    assert difference([(1, 1.0), (1, 3.0)], [(1, 5.0), (2, 7.0)]).test == WELCH
    # Runs without a seed override cannot be paired.
    assert difference([(None, 1.0), (None, 3.0)], [(None, 5.0), (None, 7.0)]).test == WELCH


def test_too_few_runs_or_no_spread_give_no_test():
    single = difference([(1, 0.9)], [(1, 0.8), (2, 0.82)])
    assert (single.mean, single.test, single.p, single.low) == (pytest.approx(0.09), None, None, None)
    constant = difference([(1, 0.9), (2, 0.9)], [(1, 0.8), (2, 0.8)])  # every difference 0.1
    assert constant.test == PAIRED and math.isnan(constant.p) and constant.low is None


def test_holms_step_down_adjustment():
    # sorted 0.01, 0.03, 0.04 of m = 3: 3 x 0.01 = 0.03; 2 x 0.03 = 0.06; max(0.06, 1 x 0.04) = 0.06
    adjusted = holm_adjusted([0.01, 0.04, 0.03, None, math.nan])
    assert adjusted[:4] == pytest.approx([0.03, 0.06, 0.06, None]) and math.isnan(adjusted[4])
    assert holm_adjusted([0.6, 0.7]) == [1.0, 1.0]  # capped at 1
    assert holm_adjusted([]) == []


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
