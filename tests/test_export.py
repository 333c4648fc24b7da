"""Exporting a trained model: the ONNX file (run by ONNX Runtime) and the TorchScript file give the
model's scores and poses within 1e-4 on the same images, at another batch size than the one traced, for
every model and every routing; what cannot be exported says why in a few lines."""

from __future__ import annotations

import json

import pytest
import torch

from capsexp.config.instantiation import build_model, instantiate
from capsexp.use.export import ExportError, export, runner
from capsexp.use.inference import TrainedModel
from tests.helpers import TINY_EM_CAPS, compose_config, run_cli_in_process

ROUTINGS = ["dynamic", "em", "em_paper", "self", "attention", "efficient", "sinkhorn", "vb", "uniform"]
TINY_CAPSNET = ["model=capsnet_small", "model.net.conv_channels=16", "model.net.primary_types=4"]
MODELS = {
    "lenet5": ["model=lenet5"],
    "baseline_cnn": ["model=baseline_cnn"],
    "em_caps_small": ["model=em_caps_small", *TINY_EM_CAPS],
    "em_caps_on_cifar10": ["model=em_caps", "data=cifar10", "model.net.backbone=resnet", *TINY_EM_CAPS],
    # smallNORB's stored images are larger than the net's input (cropped at evaluation)
    "em_caps_small_on_smallnorb": ["model=em_caps_small", "data=smallnorb", *TINY_EM_CAPS],
    **{f"capsnet_{routing}": [*TINY_CAPSNET, f"model/routing={routing}"] for routing in ROUTINGS},
}
# ONNX's exporter takes 4 to 20 s per model here: the fast suite exports CapsNet with dynamic routing (the
# TorchScript test takes every model, EM routing's export path included), make test-all every model to ONNX.
FAST_ONNX = {"capsnet_dynamic"}


def trained_model(overrides: list[str], tmp_path) -> TrainedModel:
    """A model as capsexp.load gives it, eval mode, untrained (parity is what is tested) but with its weights,
    biases and BatchNorm statistics moved off their initial values, so that none of them is trivial."""
    cfg = compose_config([*overrides, f"paths.data_dir={tmp_path}"], tmp_path)
    module = build_model("model", cfg.model)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.01)
        for name, buffer in module.named_buffers():
            if name.endswith("running_var"):
                buffer.uniform_(0.5, 2)
    return TrainedModel(module, instantiate("data", cfg.data, _convert_="all"), cfg, tmp_path / "x.ckpt", None)


def parity(model: TrainedModel, format: str, tmp_path) -> None:
    path = export(model, format, tmp_path / f"model.{format}", batch=2)
    size = model.datamodule.evaluation_size
    images = torch.randint(0, 256, (5, model.channels, size, size), dtype=torch.uint8)  # not the traced batch
    # What the file must give: what capsexp's own predict path says of these images (its scores as it
    # reports them, its class capsules' poses), not what the exported module itself computes.
    with torch.no_grad():
        predicted = model.forward(model.inputs(images))
    eager = (predicted.scores,) if predicted.poses is None else (predicted.scores, predicted.poses)
    exported = runner(format, path)(images)
    assert len(exported) == len(eager) == (1 if model.score_kind.endswith("probability") else 2)
    for ours, theirs in zip(eager, exported, strict=True):
        assert theirs.shape == ours.shape and torch.allclose(theirs, ours, atol=1e-4, rtol=0), (
            (ours - theirs).abs().max()
        )
    sidecar = json.loads(path.with_suffix(".json").read_text())
    assert sidecar["class_names"] == model.class_names and sidecar["score_kind"] == model.score_kind
    assert sidecar["inputs"]["images"]["shape"] == ["N", model.channels, size, size]  # what it was given here


def test_the_check_compares_every_output_on_every_image_it_is_given(tmp_path):
    """The export command's check on 7 images (not the two traced): the scores and the class capsules' poses."""
    from capsexp.use.export import compare

    model = trained_model(MODELS["capsnet_dynamic"], tmp_path)
    path = export(model, "torchscript", tmp_path / "model.pt", batch=2)
    images = torch.randint(0, 256, (7, 1, 28, 28), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    result = compare(model, "torchscript", path, images)
    assert result["images_checked"] == 7
    assert {"max_abs_difference_scores", "max_abs_difference_poses"} <= set(result)


@pytest.mark.parametrize("name", list(MODELS))
def test_torchscript_gives_the_models_outputs(name, tmp_path):
    parity(trained_model(MODELS[name], tmp_path), "torchscript", tmp_path)


@pytest.mark.parametrize(
    "name", [name if name in FAST_ONNX else pytest.param(name, marks=pytest.mark.slow) for name in MODELS]
)
def test_onnx_runtime_gives_the_models_outputs(name, tmp_path):
    pytest.importorskip("onnxruntime")
    parity(trained_model(MODELS[name], tmp_path), "onnx", tmp_path)


def test_random_routing_and_unknown_formats_are_refused_with_the_reason(tmp_path):
    model = trained_model([*TINY_CAPSNET, "model/routing=random"], tmp_path)
    with pytest.raises(ExportError, match=r"CapsNet\.digits routes with routing=random: it draws new couplings"):
        export(model, "onnx", tmp_path / "model.onnx")
    with pytest.raises(Exception, match="format=tflite: choose one of onnx, torchscript"):
        export(trained_model(["model=lenet5"], tmp_path), "tflite", tmp_path / "model.tflite")


def test_the_export_command_writes_checks_and_times_the_file(tmp_path):
    from tests.helpers import TINY_RUN, write_mnist

    data_dir = write_mnist(tmp_path / "data")
    run = tmp_path / "run"
    trained = run_cli_in_process(
        *TINY_RUN,
        "model=lenet5",
        f"paths.data_dir={data_dir}",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        f"hydra.run.dir={run}",
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    from capsexp.export import cli as main

    out = tmp_path / "out"
    result = run_cli_in_process(
        f"ckpt_path={run}", "format=torchscript", "check_images=50", f"hydra.run.dir={out}", entry=main
    )
    assert result.returncode == 0, result.stderr[-2000:]
    check = json.loads((out / "check.json").read_text())
    assert check["images"] == "the first 50 test images of mnist" and check["max_abs_difference_scores"] <= 1e-4
    assert check["predictions_equal"] and check["file_bytes"] == (out / "model.pt").stat().st_size
    assert check["images_checked"] == 50
    refused = run_cli_in_process(f"ckpt_path={run}", "format=tflite", f"hydra.run.dir={out}", entry=main)
    assert refused.returncode == 2 and "format=tflite: choose one of onnx, torchscript" in refused.stderr
    assert "Traceback" not in refused.stderr
