"""experiment=routing_engagement: its arms compose what they say, and its page leads with the couplings'
engagement over training."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from omegaconf import OmegaConf
from torch.utils.tensorboard import SummaryWriter

from capsexp.results.compare import compare
from capsexp.results.runs import find_runs, group, label_configurations
from capsexp.results.study import StudyPage
from capsexp.studies.engagement import FIGURE, curve, figures
from tests.helpers import compose_config

START = 1795564800  # 2026-11-25 00:00 UTC
QUICK = ["experiment=routing_engagement", "study=quick"]


def net_and_objective(*overrides: str) -> dict:
    model = OmegaConf.to_container(compose_config(list(overrides)).model, resolve=True)
    return {"net": model["net"], "objective": model["objective"]}


def differences(left: dict, right: dict, prefix: str = "") -> dict:
    """The dotted keys whose values differ, with the left's value."""
    found = {}
    for key in left.keys() | right.keys():
        a, b = left.get(key), right.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found |= differences(a, b, f"{prefix}{key}.")
        elif a != b:
            found[f"{prefix}{key}"] = a
    return found


def test_the_official_arm_is_model_capsnet_officials_difference_from_model_capsnet():
    """The arm restates capsnet_official's keys on the study's smaller model: they must stay those keys."""
    official = differences(net_and_objective("model=capsnet_official"), net_and_objective("model=capsnet"))
    arm = differences(
        net_and_objective(*QUICK, "model=capsnet_small", "+arm/routing_engagement=official"),
        net_and_objective(*QUICK, "model=capsnet_small", "+arm/routing_engagement=dynamic"),
    )
    assert arm == official and official  # capsule_bias, official_init, the reconstruction's weight


@pytest.mark.parametrize(
    ("arm", "routing"),
    [
        ("uniform", {"_target_": "capsexp.nn.UniformRouting"}),
        ("dynamic_5_iterations", {"iterations": 5, "logit_scale": 1.0}),
        ("logit_scale_20", {"iterations": 3, "logit_scale": 20.0}),
        ("official_uniform", {"iterations": 1}),
        ("em", {"_target_": "capsexp.nn.EMRouting", "sigma_eps": 1e-4}),
    ],
)
def test_each_arm_routes_as_its_name_says_on_the_studys_data(arm, routing):
    config = compose_config([*QUICK, "model=capsnet_small", f"+arm/routing_engagement={arm}"])
    composed = OmegaConf.to_container(config.model.net.routing, resolve=True)
    assert {key: composed.get(key) for key in routing} == routing
    # MNIST on its own 28x28 canvas, so that the affine test set can be drawn; 3 epochs at the quick budget
    data = (config.data.canvas, list(config.data.extra_test_sets), config.trainer.max_epochs)
    assert data == (28, ["affine_mnist"], 3)


def write_run(folder: Path, arm: str, seed: int, kl: list[float], job: int) -> None:
    (folder / ".hydra").mkdir(parents=True)
    overrides = [f"+arm/routing_engagement={arm}", f"seed={seed}", *QUICK]
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    with SummaryWriter(str(folder / "tensorboard")) as writer:
        for index, value in enumerate(kl):
            wall = START + 3600 * job + 10 * index
            writer.add_scalar("routing/digits/kl_from_uniform", value, 100 * index, walltime=wall)
            writer.add_scalar("routing/digits/largest_coupling", 0.1 + value, 100 * index, walltime=wall)
            writer.add_scalar("routing/digits/decided_share", min(1.0, 10 * value), 100 * index, walltime=wall)
        writer.add_scalar("val/acc", 0.9 + 0.01 * seed, 200, walltime=START + 3600 * job + 30)
        writer.add_scalar("test/acc", 0.9 + 0.01 * seed, 200, walltime=START + 3600 * job + 40)
        writer.add_scalar("test/acc_affine_mnist", 0.6 + 0.01 * seed, 200, walltime=START + 3600 * job + 40)


def test_the_page_leads_with_engagement_over_training_and_its_comparison_heads_the_results(tmp_path):
    curves = {
        ("uniform", 1): [0.0, 0.0, 0.0],
        ("uniform", 2): [0.0, 0.0, 0.0],
        ("dynamic", 1): [0.0, 0.001, 0.004],
        ("dynamic", 2): [0.0, 0.003, 0.002],
        ("em", 1): [0.0, 0.2, 0.3],
    }
    for job, ((arm, seed), kl) in enumerate(curves.items()):
        write_run(tmp_path / "sweep" / str(job), arm, seed, kl, job)
    runs = find_runs(tmp_path / "sweep")
    label_configurations(runs)
    dynamic = next(c for c in group(runs) if c.label == "+arm/routing_engagement=dynamic")
    steps, mean, low, high = curve(dynamic, "routing/digits/kl_from_uniform")
    assert steps.tolist() == [0, 100, 200]
    np.testing.assert_allclose(mean, [0.0, 0.002, 0.003], rtol=1e-6)
    np.testing.assert_allclose(low, [0.0, 0.001, 0.002], rtol=1e-6)
    np.testing.assert_allclose(high, [0.0, 0.003, 0.004], rtol=1e-6)

    # An engagement measure's difference, paired by seed, in its own units: last KL 0.004 and 0.002 against 0.
    gap = figures(runs, StudyPage())["scalar_difference"](
        "routing/digits/kl_from_uniform", "+arm/routing_engagement=dynamic", "+arm/routing_engagement=uniform"
    )
    assert gap.points == pytest.approx(0.003)
    # An effect size with its interval, never a test: uniform coupling's KL is 0 by construction.
    half = 12.706205 * 0.001  # t_{0.975, 1} x the standard error of the differences 0.004 and 0.002
    assert (gap.low, gap.high) == pytest.approx((0.003 - half, 0.003 + half), abs=1e-6)
    assert gap.p is None and not gap.significant

    result = compare(tmp_path / "sweep")
    page = (result.output / "README.md").read_text()
    images = [line for line in page.splitlines() if line.startswith("![")]
    assert images[:2] == ["![differences](differences.png)", f"![engagement]({FIGURE})"]  # the answers first
    assert (result.output / FIGURE).stat().st_size > 10_000
    results = page[page.index("## Results") :]
    assert "![headline](headline.png)" in results.split("| configuration |")[0]  # above the table
    assert images.count("![headline](headline.png)") == 1
