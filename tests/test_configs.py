"""Every config composes; every model x data pair instantiates; bad options fail helpfully."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from capsexp import CONFIG_DIR
from capsexp.lit import Classifier, class_scores
from tests.helpers import compose_config, run_cli

# Every config group, nested ones too ("model/optimizer"), and its options.
GROUPS = sorted(str(p.relative_to(CONFIG_DIR)) for p in CONFIG_DIR.rglob("*") if p.is_dir())
OPTIONS = [(group, option.stem) for group in GROUPS for option in sorted((CONFIG_DIR / group).glob("*.yaml"))]
MODELS = sorted(p.stem for p in (CONFIG_DIR / "model").glob("*.yaml"))
DATASETS = sorted(p.stem for p in (CONFIG_DIR / "data").glob("*.yaml"))


def test_groups_of_the_design_exist():
    for group in [
        "data",
        "model",
        "model/optimizer",
        "model/lr_scheduler",
        "model/margin",
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


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_resolves(group, option):
    # The groups under model/ belong to a model config that lists them (the margin: EM capsules).
    model = ["model=em_caps_small"] if group.startswith("model/") else []
    cfg = compose_config([*model, f"{group}={option}"])
    # Resolve every interpolation, as the run does when it logs its hyperparameters (compose_config
    # has set paths.output_dir, the one value that comes from Hydra's run time).
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert resolved["paths"]["data_dir"] and resolved["trainer"]["_target_"] == "lightning.pytorch.Trainer"
    assert resolved["model"]["net"]["num_classes"] == resolved["geometry"]["num_classes"]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("data", DATASETS)
def test_every_model_data_pair_instantiates_and_runs_forward(model, data, tmp_path):
    cfg = compose_config([f"model={model}", f"data={data}", "model/lr_scheduler=exponential"], output_dir=tmp_path)
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
    result = run_cli("model=nope")
    assert result.returncode == 2
    assert "error: model=nope: no such option" in result.stderr
    assert "model is one of: baseline_cnn, capsnet, em_caps," in result.stderr and "lenet5" in result.stderr


def test_cfg_job_prints_the_composed_config_without_training():
    result = run_cli("--cfg", "job", "model/optimizer=sgd", "trainer.max_epochs=3")
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
