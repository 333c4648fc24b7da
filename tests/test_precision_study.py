"""The precision equivalence page's verdict: per model config, paired bf16-mixed minus float32 differences
inside the margin back the model with its routing; a model with one row outside does not, nor one whose bf16
runs are its float32 runs; every row's TOST p-value is adjusted in one family."""

from __future__ import annotations

from pathlib import Path

import pytest

from capsexp.records.events import Scalar
from capsexp.records.metric_names import PRESENCE_GAP, TEST_ACC
from capsexp.results.runs import Run
from capsexp.studies import precision as study

# Test accuracies of 5 seeds in float32, and bf16's differences from them (fractions: 0.001 is 0.1 points).
FLOAT32 = [0.9712, 0.9688, 0.9731, 0.9695, 0.9704]
CLOSE = [0.0004, -0.0006, 0.0002, -0.0001, 0.0005]  # mean +0.008 points, far inside +-0.3
SPREAD = [0.0040, -0.0035, 0.0052, -0.0041, 0.0010]  # mean +0.05 points, interval wider than the margin


def run(arm: str, precision: str, seed: int, metrics: dict[str, float]) -> Run:
    overrides = [f"+arm/precision_equivalence={arm}", f"trainer.precision={precision}", f"seed={seed}"]
    return Run(Path(f"/runs/{arm}-{precision}-{seed}"), overrides, {k: [Scalar(100, v)] for k, v in metrics.items()})


def runs_of(arm: str, differences: list[float], gap_differences: list[float] | None = None) -> list[Run]:
    found = []
    for seed, (accuracy, difference) in enumerate(zip(FLOAT32, differences, strict=True), start=1):
        gap = {} if gap_differences is None else {PRESENCE_GAP: 0.61}
        bf16_gap = {} if gap_differences is None else {PRESENCE_GAP: 0.61 + gap_differences[seed - 1]}
        found.append(run(arm, "32-true", seed, {TEST_ACC: accuracy, **gap}))
        found.append(run(arm, "bf16-mixed", seed, {TEST_ACC: accuracy + difference, **bf16_gap}))
    return found


def test_a_net_is_backed_only_where_every_row_is_inside_the_margin():
    runs = runs_of("capsnet_small", CLOSE, CLOSE[::-1]) + runs_of("lenet5", SPREAD)
    rows = study.rows(runs)
    assert [(r.arm, r.metric) for r in rows] == [
        ("capsnet_small", TEST_ACC),
        ("capsnet_small", PRESENCE_GAP),
        ("lenet5", TEST_ACC),
    ]
    close = rows[0]
    assert close.float32 == pytest.approx(100 * sum(FLOAT32) / 5)
    assert close.test.mean == pytest.approx(100 * sum(CLOSE) / 5) and close.test.n == 5
    assert close.backed and rows[1].backed and not rows[2].backed
    # Holm over the page's three tests: the smallest p times 3, at least
    assert min(r.p_holm for r in rows) >= 3 * min(r.test.p for r in rows) - 1e-12
    assert study.backed_models(runs) == {"capsnet_small": "capsexp.nn.DynamicRouting"}


def test_each_model_config_has_its_own_verdict_and_identical_runs_back_nothing():
    """CapsNet at the paper's size (uniform coupling) outside the margin leaves capsnet_small backed; a model
    whose bf16 runs equal its float32 runs (all differences 0) is not chosen: bf16 gives it nothing."""
    runs = runs_of("capsnet_small", CLOSE) + runs_of("capsnet_uniform", SPREAD) + runs_of("em_caps_small", [0.0] * 5)
    assert study.model_of("capsnet_uniform") == ("capsnet", "capsexp.nn.UniformRouting")
    assert study.model_of("em_caps_small") == ("em_caps_small", "capsexp.nn.EMRouting")
    identical = [row for row in study.rows(runs) if row.arm == "em_caps_small"]
    assert identical[0].identical and not identical[0].backed and identical[0].p_holm != identical[0].p_holm  # untested
    assert study.backed_models(runs) == {"capsnet_small": "capsexp.nn.DynamicRouting"}


def test_seeds_run_in_one_precision_only_are_not_paired():
    runs = runs_of("lenet5", CLOSE)[:-1]  # seed 5's bf16 run missing
    (row,) = study.rows(runs)
    assert row.test.n == 4
