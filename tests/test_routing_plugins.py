"""A routing from another installed package (an entry point of the group capsexp.routing), with nothing of
capsexp changed: chosen, set and checked from the command line, an arm of a study, listed by --help."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import PROJECT_ROOT, TINY_RUN

PLUGIN = '''
"""Agreement routing in one pass: couplings softmax_j(u_hat_j|i . mean_k u_hat_j|k / temperature)."""
from dataclasses import dataclass
from typing import ClassVar

import torch

from capsexp.nn import Routing
from capsexp.nn.functional import Routed, squash


@dataclass(frozen=True)
class MeanAgreementRouting(Routing):
    temperature: float = 1.0
    router: ClassVar[str] = "mean_agreement:route"


def route(votes, options):
    agreement = (votes * votes.mean(dim=1, keepdim=True)).sum(dim=-1) / options.temperature
    couplings = torch.softmax(agreement, dim=-1)
    poses = squash((couplings.unsqueeze(-1) * votes).sum(dim=1))
    return Routed(poses, poses.norm(dim=-1), couplings)
'''


@pytest.fixture
def plugin(tmp_path) -> dict[str, str]:
    """An installed package as importlib.metadata finds one (its module and its .dist-info on the path),
    registering mean_agreement; the environment of a process that has it."""
    (tmp_path / "mean_agreement.py").write_text(textwrap.dedent(PLUGIN))
    info = tmp_path / "mean_agreement-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mean-agreement\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[capsexp.routing]\nmean_agreement = mean_agreement:MeanAgreementRouting\n")
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "PYTHONWARNINGS": "ignore"}


def _capsexp(environment: dict[str, str], *arguments: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "capsexp", *arguments]
    return subprocess.run(command, cwd=PROJECT_ROOT, env=environment, capture_output=True, text=True, timeout=300)


def test_a_packages_routing_trains_in_capsnets_place_and_is_an_arm_of_the_routing_comparison(
    plugin, mnist_dir, tmp_path
):
    run = tmp_path / "run"
    small = ["model=capsnet", "model.net.conv_channels=8", "model.net.primary_types=2", f"paths.data_dir={mnist_dir}"]
    result = _capsexp(
        plugin, *TINY_RUN, *small, "model/routing=mean_agreement", "model.net.routing.temperature=4",
        "trainer.max_steps=2", "trainer.val_check_interval=2", f"hydra.run.dir={run}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    config = (run / ".hydra" / "config.yaml").read_text()
    assert "_target_: mean_agreement.MeanAgreementRouting" in config and "temperature: 4" in config
    # As an arm of the routing comparison, with a typo in its options: the arm composes (the routing's own
    # keys are offered), and the typo is answered as for a built-in routing's.
    arm = ["experiment=routing_comparison", "study=quick", "+arm/routing=mean_agreement"]
    typo = _capsexp(plugin, *arm, "model.net.routing.temprature=4")
    assert typo.returncode == 2 and "(did you mean model.net.routing.temperature?)" in typo.stderr, typo.stderr[-2000:]
    assert "Traceback" not in typo.stderr


def test_a_packages_routing_is_listed_by_help(plugin):
    listed = _capsexp(plugin, "--help")
    assert listed.returncode == 0
    (line,) = [line for line in listed.stdout.splitlines() if line.startswith("model/routing:")]
    assert "mean_agreement" in line and "dynamic" in line
    (arms,) = [line for line in listed.stdout.splitlines() if line.startswith("arm/routing:")]
    assert "mean_agreement" in arms


def test_a_package_whose_entry_point_is_not_a_routing_is_named():
    from importlib.metadata import EntryPoint

    from capsexp.config.routing_registry import _options
    from capsexp.errors import ConfigError

    point = EntryPoint(name="broken", value="os.path:join", group="capsexp.routing")
    with pytest.raises(ConfigError, match=r"where: names <function join.*not a routing's options"):
        _options(point, "where")
