"""Every config composes; every model x data pair instantiates; bad options fail helpfully."""

from __future__ import annotations

import inspect
import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra.utils import get_object, instantiate
from omegaconf import OmegaConf

from capsexp.config.config_check import config_problems
from capsexp.config.hydra_setup import NETS, ROUTINGS
from capsexp.lit import Classifier, class_scores
from capsexp.locations import CONFIG_DIR
from tests.helpers import (
    SAME_GEOMETRY_AS,
    TINY_EM_CAPS,
    compose_config,
    data_overrides,
    required_choices,
    run_cli_in_process,
)

# Every config group, nested ones too ("model/optimizer"), and its options: files under conf/, and the
# nodes capsexp.config.hydra_setup generates from the code (the routing options, the nets).
STORED = {"model/routing": sorted(ROUTINGS), "model/net": sorted(target.rpartition(".")[2] for target in NETS)}
GROUPS = sorted({str(p.relative_to(CONFIG_DIR)) for p in CONFIG_DIR.rglob("*") if p.is_dir()} | set(STORED))
OPTIONS = [
    (group, option)
    for group in GROUPS
    for option in STORED.get(group) or sorted(path.stem for path in (CONFIG_DIR / group).glob("*.yaml"))
]
# The model config whose net each net class builds with its constructor's defaults.
MODEL_OF_NET = {"LeNet5": "lenet5", "BaselineCNN": "baseline_cnn", "CapsNet": "capsnet", "MatrixCapsNet": "em_caps"}
MODELS = sorted(p.stem for p in (CONFIG_DIR / "model").glob("*.yaml"))
# The arms of studies (conf/arm/<group>/) compose within an experiment config that sweeps them (they
# read its budget): one that does, for each group.
ARM_EXPERIMENT = {
    key.removeprefix("+"): path.stem
    for path in sorted((CONFIG_DIR / "experiment").glob("*.yaml"))
    for key in (OmegaConf.load(path).get("hydra") or {}).get("sweeper", {}).get("params", {})
    if key.startswith("+arm/")
}
DATASETS = sorted(p.stem for p in (CONFIG_DIR / "data").glob("*.yaml"))
# Every model with one data config per input geometry, and every data config with CapsNet: the data
# configs of the same geometry build the same nets (SAME_GEOMETRY_AS).
MODEL_DATA = sorted(
    set(itertools.product(MODELS, [d for d in DATASETS if d not in SAME_GEOMETRY_AS]))
    | {("capsnet", data) for data in DATASETS}
)


def test_groups_of_the_design_exist():
    for group in [
        "data",
        "model",
        "model/optimizer",
        "model/lr_scheduler",
        "model/margin",
        "model/routing",
        "model/net",
        "hparams_search",
        "trainer",
        "logger",
        "callbacks",
        "paths",
        "hydra",
        "experiment",
        "debug",
    ]:
        assert group in GROUPS
    assert {"adam", "sgd"} <= {o for g, o in OPTIONS if g == "model/optimizer"}
    assert {"default", "cpu", "gpu", "ddp"} <= {o for g, o in OPTIONS if g == "trainer"}


# A model or data config alone: every model x data pair composes, resolves and builds, below.
GROUPED_OPTIONS = [(group, option) for group, option in OPTIONS if group not in ("model", "data")]


# A study's arms (conf/arm/, 74 files) each compose within their experiment, half a second apiece: make
# test-slow composes every one; the fast suite composes every experiment at each of its budgets
# (tests/test_studies.py) and every option of the other groups.
@pytest.mark.parametrize(
    "group,option",
    [
        pytest.param(g, o, id=f"{g}={o}", marks=[pytest.mark.slow] if g.startswith("arm/") else [])
        for g, o in GROUPED_OPTIONS
    ],
)
def test_every_option_composes_and_resolves(group, option, colour_folder_of):
    # The groups under model/ belong to a model config that lists them (the margin: EM capsules; the
    # loss: CapsNet).
    model = (
        [f"model={'capsnet_small' if group == 'model/loss' else 'em_caps_small'}"] if group.startswith("model/") else []
    )
    if group == "model/net":
        model = [f"model={MODEL_OF_NET[option]}"]
    if group.startswith("arm/"):
        assert group in ARM_EXPERIMENT, f"no experiment config sweeps {group}"
        # An image folder's classes are counted when the config resolves: a folder of images to count.
        root = [f"image_folder_root={colour_folder_of()}"] if option == "image_folder" else []
        # An experiment that judges one routing (requires: [routing]) is given one.
        required = required_choices(ARM_EXPERIMENT[group])
        cfg = compose_config([f"experiment={ARM_EXPERIMENT[group]}", f"+{group}={option}", *root, *required])
    else:
        cfg = compose_config([*model, f"{group}={option}"])
    # Resolve every interpolation, as the run does when it logs its hyperparameters (compose_config
    # has set paths.output_dir, the one value that comes from Hydra's run time).
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert resolved["paths"]["data_dir"] and resolved["trainer"]["_target_"] == "lightning.pytorch.Trainer"
    assert resolved["model"]["net"]["num_classes"] == resolved["geometry"]["num_classes"]


@pytest.mark.parametrize("model,data", MODEL_DATA)
def test_every_model_data_pair_passes_the_check_and_runs_forward(model, data, tmp_path, colour_folder_of):
    overrides = [
        f"model={model}",
        f"data={data}",
        "model/lr_scheduler=exponential",
        *data_overrides(data, colour_folder_of),
    ]
    cfg = compose_config(overrides, output_dir=tmp_path)
    assert config_problems(cfg) == []
    resolved = OmegaConf.to_container(cfg, resolve=True)  # as the run does when it logs its hyperparameters
    assert resolved["model"]["net"]["num_classes"] == resolved["geometry"]["num_classes"]
    module = instantiate(cfg.model, _convert_="partial")
    datamodule = instantiate(cfg.data)
    assert isinstance(module, Classifier)
    channels, size, classes = cfg.geometry.channels, cfg.geometry.image_size, cfg.geometry.num_classes
    assert tuple(datamodule.dims) == (channels, size, size)
    assert cfg.geometry.objects == datamodule.objects_per_image
    images = torch.rand(3, channels, size, size)
    scores = class_scores(module(images))
    assert scores.shape == (3, classes)
    optimizers = module.configure_optimizers()
    assert optimizers["lr_scheduler"]["interval"] == "step"


def test_unknown_option_lists_the_available_ones():
    result = run_cli_in_process("model=nope")
    assert result.returncode == 2
    assert "error: model=nope: no such option" in result.stderr
    assert (
        "model is one of: baseline_cnn, capsnet, capsnet_cifar10, capsnet_official, capsnet_small, em_caps,"
        in result.stderr
        and "lenet5" in result.stderr
    )


def test_cfg_job_prints_the_composed_config_without_training():
    result = run_cli_in_process("--cfg", "job", "model/optimizer=sgd", "trainer.max_epochs=3")
    assert result.returncode == 0, result.stderr
    assert "torch.optim.SGD" in result.stdout and "max_epochs: 3" in result.stdout


def test_the_networks_and_capsule_ops_load_neither_lightning_nor_hydra():
    # Pure torch.nn: a user can import the models into their own training code without the framework.
    probe = (
        "import sys, capsexp.nn, capsexp.nn.functional, capsexp.models\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'lightning', 'pytorch_lightning', 'hydra', 'omegaconf', 'torchmetrics'}))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def _plain(value):
    """A constructor default or a built argument as config holds it: tuples as lists."""
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


@pytest.mark.parametrize(("net_class", "model"), MODEL_OF_NET.items())
def test_a_nets_constructor_defaults_build_its_default_model_config(net_class, model):
    """``MatrixCapsNet()`` is ``model=em_caps``'s net, and so on: every argument the config passes is the
    constructor's default (MNIST's geometry is the constructors' default geometry), and both build the
    same modules."""
    cfg = compose_config([f"model={model}", "data=mnist"])
    target = get_object(cfg.model.net._target_)
    assert target.__name__ == net_class
    arguments = instantiate(cfg.model.net, _partial_=True, _convert_="all").keywords
    defaults = {name: p.default for name, p in inspect.signature(target).parameters.items()}
    assert arguments.keys() == defaults.keys()
    for name, value in arguments.items():
        assert _plain(value) == _plain(defaults[name]), name
    torch.manual_seed(0)
    from_config = instantiate(cfg.model.net)
    torch.manual_seed(0)
    from_python = target()
    assert repr(from_config) == repr(from_python)
    for (name, a), (_, b) in zip(from_config.state_dict().items(), from_python.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("data", ["mnist", "multi_mnist", "smallnorb"])
def test_a_datamodules_constructor_defaults_are_its_data_config(data):
    """``MultiMNISTDataModule()`` is ``data=multi_mnist`` (and so on): the config a user reads lists every
    argument with the value the class takes when built from Python (paths aside)."""
    node = compose_config([f"data={data}"]).data
    built = get_object(node._target_)()  # from Python, no arguments (nothing is read before setup)
    listed = OmegaConf.to_container(node, resolve=False)
    assert listed.keys() - {"_target_"} == built.hparams.keys()
    assert built.hparams.data_dir == str(Path("data").resolve())  # from Python: ./data; the config: paths.data_dir
    for name, value in listed.items():
        if name != "_target_" and not (isinstance(value, str) and value.startswith("${")):
            default = _plain(built.hparams[name])
            if isinstance(default, float):  # the config writes 63/255 to 8 places
                default = pytest.approx(default, rel=1e-7)
            assert _plain(value) == default, f"data={data}: data.{name}"


@pytest.mark.parametrize("path", sorted((CONFIG_DIR / "model").glob("*.yaml")), ids=lambda p: p.stem)
def test_a_model_config_sets_only_what_differs_from_its_nets_defaults(path):
    """A recipe's YAML holds its deviations (and the data's geometry), not a second copy of a default."""
    cfg = compose_config([f"model={path.stem}"])
    defaults = inspect.signature(get_object(cfg.model.net._target_)).parameters
    own = OmegaConf.load(path).get("net") or {}
    for name in own:
        value = OmegaConf.to_container(own, resolve=False)[name]
        if isinstance(value, str) and value.startswith("${geometry."):
            continue
        assert _plain(value) != _plain(defaults[name].default), f"{path.name}: net.{name}={value} is the default"


@pytest.mark.parametrize(("model", "override", "expected"), [("capsnet", "model.net.pose_dim=8", 8)])
def test_every_constructor_argument_of_a_net_is_settable_without_plus(model, override, expected):
    """Arguments no model config names (CapsNet's pose_dim) are in the composed config all the same."""
    key = override.split("=")[0]
    assert OmegaConf.select(compose_config([f"model={model}"]), key) != expected
    net = instantiate(compose_config([f"model={model}", override]).model.net)
    assert getattr(net, key.rpartition(".")[2]) == expected  # each net keeps these as attributes


def test_the_em_options_the_config_builds_reach_em_routing_as_that_object(monkeypatch):
    import capsexp.nn.matrix_capsules

    cfg = compose_config(["model=em_caps", *TINY_EM_CAPS])
    net = instantiate(cfg.model.net)
    built = net.conv_caps1.router.routing
    assert built is net.conv_caps2.router.routing and built is net.class_caps.router.routing
    assert built == instantiate(cfg.model.net.routing) and built.iterations == cfg.model.net.routing.iterations
    received = []
    original = capsexp.nn.matrix_capsules.em_routing

    def spy(*args, **kwargs):
        received.append(args[4])
        return original(*args, **kwargs)

    monkeypatch.setattr(capsexp.nn.matrix_capsules, "em_routing", spy)
    net(torch.rand(2, 1, 28, 28))
    assert len(received) == 3 and all(routing is built for routing in received)


def test_the_yaml_names_each_metric_as_the_code_declares_it():
    """Every ``monitor:`` and ``optimized_metric:`` of conf/ is one of the names in
    capsexp.records.metric_names, spelled as there; the default config's are val/acc and val/acc_best."""
    from capsexp.records import metric_names

    declared = {value for name, value in vars(metric_names).items() if name.isupper() and isinstance(value, str)}
    named = [
        (path.name, match)
        for path in CONFIG_DIR.rglob("*.yaml")
        for match in re.findall(r"^\s*(?:monitor|optimized_metric):\s*([^\s#]+)", path.read_text(), re.M)
    ]
    assert len(named) >= 4 and all(value in declared for _, value in named), named
    cfg = compose_config(["callbacks=[default,stop_at_accuracy]"])
    assert cfg.callbacks.model_checkpoint.monitor == cfg.callbacks.stop_at_accuracy.monitor == metric_names.VAL_ACC
    assert cfg.optimized_metric == metric_names.VAL_ACC_BEST
