"""A routing from another installed package (an entry point of the group capsexp.routing), with nothing of
capsexp changed: chosen, set and checked from the command line, an arm of a study, listed by --help; its
run predicted, explained and exported; its package's own study composed from its conf/ folder."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers import PROJECT_ROOT, TINY_RUN, write_png

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
    coupled_parents: ClassVar[bool] = True  # its parents are Eq. 1's of its couplings


def route(votes, options):
    agreement = (votes * votes.mean(dim=1, keepdim=True)).sum(dim=-1) / options.temperature
    couplings = torch.softmax(agreement, dim=-1)
    poses = squash((couplings.unsqueeze(-1) * votes).sum(dim=1))
    return Routed(poses, poses.norm(dim=-1), couplings)
'''


STUDY = """\
# @package _global_
budgets:
  quick: {seeds: "1,2"}
  long: {seeds: "1,2,3"}
hydra:
  sweeper:
    params:
      +arm/routing: mean_agreement,dynamic
      seed: ${budgets.${study}.seeds}
page:
  title: Mean agreement against dynamic routing
"""


@pytest.fixture
def plugin(tmp_path) -> dict[str, str]:
    """An installed package as importlib.metadata finds one (its package and its .dist-info on the path),
    registering mean_agreement, with a study of its own; the environment of a process that has it."""
    package = tmp_path / "mean_agreement"
    (package / "conf" / "experiment").mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(PLUGIN))
    (package / "conf" / "experiment" / "mean_agreement_study.yaml").write_text(STUDY)
    info = tmp_path / "mean_agreement-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mean-agreement\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[capsexp.routing]\nmean_agreement = mean_agreement:MeanAgreementRouting\n")
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "PYTHONWARNINGS": "ignore"}


def _capsexp(environment: dict[str, str], *arguments: str) -> subprocess.CompletedProcess:
    return _tool(environment, "", *arguments)


def _tool(environment: dict[str, str], tool: str, *arguments: str) -> subprocess.CompletedProcess:
    """``python -m capsexp[.<tool>] <arguments>`` in a process with the package."""
    command = [sys.executable, "-m", f"capsexp.{tool}".rstrip("."), *arguments]
    return subprocess.run(command, cwd=PROJECT_ROOT, env=environment, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
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
    # Its couplings were drawn at validation, as a built-in routing's are.
    events = EventAccumulator(str(run), size_guidance={"images": 0})
    events.Reload()
    assert "routing/digits/couplings" in events.Tags()["images"]
    # Its run is used as any other: predicted, with each image's couplings drawn, and exported.
    images = tmp_path / "digits"
    images.mkdir()
    for index in range(3):
        write_png((torch.rand(3, 28, 28) * 80 * (index + 1)).to(torch.uint8), images / f"digit_{index}.png")
    predicted = _tool(
        plugin, "predict", f"ckpt_path={run}", f"images={images}", "explain=2", f"hydra.run.dir={run / 'p'}"
    )
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    assert len((run / "p" / "predictions.csv").read_text().splitlines()) == 4
    assert len(list((run / "p" / "explain").rglob("*.png"))) == 2
    exported = _tool(plugin, "export", f"ckpt_path={run}", "format=torchscript", f"hydra.run.dir={run / 'e'}")
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert "largest difference" in exported.stdout + exported.stderr
    # As an arm of the routing comparison, with a typo in its options: the arm composes (the routing's own
    # keys are offered), and the typo is answered as for a built-in routing's.
    arm = ["experiment=routing_comparison", "study=quick", "+arm/routing=mean_agreement"]
    typo = _capsexp(plugin, *arm, "model.net.routing.temprature=4")
    assert typo.returncode == 2 and "(did you mean model.net.routing.temperature?)" in typo.stderr, typo.stderr[-2000:]
    assert "Traceback" not in typo.stderr


@pytest.mark.slow
def test_a_packages_routing_is_listed_by_help(plugin):
    listed = _capsexp(plugin, "--help")
    assert listed.returncode == 0
    (line,) = [line for line in listed.stdout.splitlines() if line.startswith("model/routing:")]
    assert "mean_agreement" in line and "dynamic" in line
    (arms,) = [line for line in listed.stdout.splitlines() if line.startswith("arm/routing:")]
    assert "mean_agreement" in arms


@pytest.mark.slow
def test_a_studys_jobs_are_listed_without_running_them_and_arms_on_the_command_line_replace_its_own(plugin, tmp_path):
    """``-m experiment=<study> +arm/routing=a,b --cfg job``: the jobs, one line each, and nothing run (Hydra
    alone refuses --cfg with -m in a traceback). The study sweeps mean_agreement,dynamic over its budget's
    seeds (STUDY above); the command line's arms take their place."""
    listed = _capsexp(
        plugin, "-m", "experiment=mean_agreement_study", "study=quick", "+arm/routing=uniform,dynamic",
        "--cfg", "job", f"hydra.sweep.dir={tmp_path / 'sweep'}",
    )  # fmt: skip
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr[-3000:]
    jobs = [line.split(maxsplit=1)[1] for line in listed.stdout.splitlines() if line.strip().startswith("#")]
    arms_and_seeds = [(arm, seed) for arm in ("uniform", "dynamic") for seed in (1, 2)]
    assert jobs == [f"+arm/routing={arm} seed={seed}" for arm, seed in arms_and_seeds], listed.stdout
    assert "in place of the experiment's mean_agreement,dynamic" in listed.stdout
    assert not (tmp_path / "sweep").exists()  # nothing ran


def test_a_package_whose_entry_point_is_not_a_routing_is_named():
    from importlib.metadata import EntryPoint

    from capsexp.config.routing_registry import _options
    from capsexp.errors import ConfigError

    point = EntryPoint(name="broken", value="os.path:join", group="capsexp.routing")
    with pytest.raises(ConfigError, match=r"where: names <function join.*not a routing's options"):
        _options(point, "where")


@pytest.mark.slow
def test_a_packages_own_study_composes_from_its_conf_folder(plugin):
    """experiment=<a study of the package> is found on Hydra's search path, its budgets checked as
    capsexp's own studies' are, and its page found where the package keeps it."""
    composed = _capsexp(plugin, "experiment=mean_agreement_study", "study=long", "--cfg", "hydra")
    assert composed.returncode == 0, composed.stderr[-3000:]
    assert (
        "+arm/routing: mean_agreement,dynamic" in composed.stdout
        and "experiment: mean_agreement_study" in composed.stdout
    )
    typo = _capsexp(plugin, "-m", "experiment=mean_agreement_study", "study=short")
    assert typo.returncode == 2 and "its budgets are: quick, long" in typo.stderr, typo.stderr[-2000:]
    page = [
        sys.executable,
        "-c",
        "from capsexp.results.study import load_study_page as p; print(p('mean_agreement_study', 'quick').source)",
    ]
    found = subprocess.run(page, env=plugin, capture_output=True, text=True, timeout=120)
    assert found.stdout.strip() == "mean_agreement/conf/experiment/mean_agreement_study.yaml", found.stderr[-2000:]


def _point(name: str, value: str, distribution: str):
    """An entry point of the group as importlib.metadata gives one from an installed distribution."""
    from importlib.metadata import EntryPoint

    from capsexp.config.routing_registry import GROUP

    point = EntryPoint(name=name, value=value, group=GROUP)
    return point._for(types.SimpleNamespace(name=distribution))


@pytest.mark.parametrize(
    "extra,message",
    [
        (  # two packages, one name: refused, naming both (the one found first keeps it)
            [
                ("mean", "capsexp.config.routing_options:DynamicRouting", "beta-pkg"),
                ("mean", "capsexp.config.routing_options:UniformRouting", "alpha-pkg"),
            ],
            "entry point mean = capsexp.config.routing_options:UniformRouting of alpha-pkg (group capsexp.routing): "
            "the name mean is taken already by entry point mean = capsexp.config.routing_options:DynamicRouting "
            "of beta-pkg",
        ),
        (  # a package taking a built-in's name: refused, the built-in kept as the name's owner
            [("dynamic", "capsexp.config.routing_options:UniformRouting", "alpha-pkg")],
            "entry point dynamic = capsexp.config.routing_options:UniformRouting of alpha-pkg (group "
            "capsexp.routing): the name dynamic is taken already by entry point dynamic = ",
        ),
    ],
    ids=["two packages", "a built-in's name"],
)
def test_a_routing_name_registered_twice_is_refused_naming_both(extra, message, monkeypatch):
    from capsexp.config import routing_registry
    from capsexp.errors import ConfigError

    installed = list(routing_registry.entry_points(group=routing_registry.GROUP))
    points = [*installed, *(_point(*entry) for entry in extra)]
    monkeypatch.setattr(routing_registry, "entry_points", lambda group: points)
    routing_registry.registered.cache_clear()
    try:
        with pytest.raises(ConfigError) as raised:
            routing_registry.registered()
    finally:
        monkeypatch.undo()
        routing_registry.registered.cache_clear()
    assert str(raised.value).startswith(message), str(raised.value)
    if "dynamic" in message:
        assert str(raised.value).endswith("of capsexp (group capsexp.routing)")
