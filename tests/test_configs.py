"""Every config composes; every model x data pair instantiates; bad options fail helpfully."""

from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate

from capsexp import CONFIG_DIR
from capsexp.lit import Classifier, class_scores
from conftest import compose_config, run_cli

GROUPS = sorted(p.name for p in CONFIG_DIR.iterdir() if p.is_dir())
OPTIONS = [(group, option.stem) for group in GROUPS for option in sorted((CONFIG_DIR / group).glob("*.yaml"))]
MODELS = sorted(p.stem for p in (CONFIG_DIR / "model").glob("*.yaml"))
DATASETS = sorted(p.stem for p in (CONFIG_DIR / "data").glob("*.yaml"))


def test_groups_of_the_design_exist():
    for group in [
        "data",
        "model",
        "optimizer",
        "lr_scheduler",
        "trainer",
        "logger",
        "callbacks",
        "paths",
        "hydra",
        "experiment",
        "debug",
    ]:
        assert group in GROUPS
    assert {"adam", "sgd"} <= {o for g, o in OPTIONS if g == "optimizer"}
    assert {"default", "cpu", "gpu", "ddp"} <= {o for g, o in OPTIONS if g == "trainer"}


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_resolves(group, option):
    cfg = compose_config([f"{group}={option}"])
    # Everything but Hydra's own run-time values must resolve.
    for key in ["data", "model", "optimizer", "lr_scheduler", "trainer", "callbacks", "logger", "paths"]:
        cfg.get(key)  # raises on a broken interpolation
    assert cfg.paths.data_dir and cfg.trainer._target_ == "lightning.pytorch.Trainer"


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("data", DATASETS)
def test_every_model_data_pair_instantiates_and_runs_forward(model, data, tmp_path):
    cfg = compose_config([f"model={model}", f"data={data}", "lr_scheduler=exponential"], output_dir=tmp_path)
    module = instantiate(cfg.model, optimizer=cfg.optimizer, lr_scheduler=cfg.lr_scheduler, _convert_="partial")
    datamodule = instantiate(cfg.data)
    assert isinstance(module, Classifier)
    channels, size, classes = cfg.dataset.channels, cfg.dataset.image_size, cfg.dataset.num_classes
    assert tuple(datamodule.dims) == (channels, size, size)
    images = torch.rand(3, channels, size, size)
    scores = class_scores(module(images))
    assert scores.shape == (3, classes)
    optimizers = module.configure_optimizers()
    assert optimizers["lr_scheduler"]["interval"] == "step"


def test_unknown_option_lists_the_available_ones():
    result = run_cli("model=nope")
    assert result.returncode == 2
    assert "error: model=nope: no such option" in result.stderr
    assert "model is one of: capsnet, em_caps," in result.stderr and "lenet5" in result.stderr


def test_cfg_job_prints_the_composed_config_without_training():
    result = run_cli("--cfg", "job", "optimizer=sgd", "trainer.max_epochs=3")
    assert result.returncode == 0, result.stderr
    assert "torch.optim.SGD" in result.stdout and "max_epochs: 3" in result.stdout
