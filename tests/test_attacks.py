"""Adversarial attacks on trained checkpoints (attack=fgsm|bim|pgd): what the sweep measures, on
every model, white-box and black-box, and the errors a user gets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from capsexp.attacks import AdversarialEvaluation, PixelClassifier
from capsexp.errors import CheckpointError, ConfigError
from capsexp.results.events import load_events
from capsexp.run.attack import source_classifier
from tests.helpers import TINY_EM_CAPS, TINY_RUN, compose_config, run_cli_in_process, scalars

EPS = "attack.eps=[0,0.1,0.3]"


@pytest.fixture(scope="module")
def attacked_run(tmp_path_factory) -> Path:
    """A LeNet5 trained for 3 epochs on synthetic MNIST, tested, then attacked with BIM (FGSM beside)."""
    from tests.helpers import write_mnist

    root = tmp_path_factory.mktemp("attack")
    data_dir = write_mnist(root / "data")
    result = run_cli_in_process(
        *TINY_RUN,
        f"paths.data_dir={data_dir}",
        "trainer.max_epochs=3",
        "attack=bim",
        EPS,
        f"paths.log_dir={root / 'logs'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (root / "logs" / "train" / "runs").iterdir()
    return run_dir


def _curve(run_dir: Path, tag: str) -> list[float]:
    return [point.value for point in sorted(scalars(run_dir)[tag], key=lambda point: point.step)]


def test_eps_zero_is_the_clean_test_accuracy_and_accuracy_falls_as_eps_grows(attacked_run):
    logged = scalars(attacked_run)
    assert [point.step for point in logged["attack/bim/acc"]] == [0, 100, 300]  # eps x 1000
    bim, fgsm = _curve(attacked_run, "attack/bim/acc"), _curve(attacked_run, "attack/bim/fgsm_acc")
    assert bim[0] == fgsm[0] == logged["test/acc"][-1].value  # the same checkpoint, the same 100 images
    assert bim[0] > 0.5, "the tiny run did not learn"
    assert bim[0] > bim[1] > bim[2] and fgsm[0] > fgsm[1] >= fgsm[2]
    assert all(b <= f for b, f in zip(bim, fgsm, strict=True))  # ten steps do at least as well as one
    assert 0 <= _curve(attacked_run, "attack/bim/zero_gradient_fraction")[0] < 0.5
    page = (attacked_run / "attack_bim.md").read_text()
    assert "100 test images" in page and "| 0.1 |" in page
    images = load_events(attacked_run, images=1).Tags()["images"]
    assert "attack/bim/examples" in images


def test_a_black_box_attack_crafts_on_the_source_checkpoint(attacked_run):
    best = next(path for path in (attacked_run / "checkpoints").glob("*.ckpt") if path.name != "last.ckpt")
    cfg = compose_config([f"paths.data_dir={attacked_run.parents[3] / 'data'}", *TINY_RUN, "attack=fgsm", EPS])
    # The source is built from its run's own config and loaded with its weights: crafted on the tested
    # checkpoint itself, a black-box FGSM gives the white-box FGSM of that run, image for image.
    source = source_classifier(str(best), cfg)
    target = instantiate(cfg.model, _convert_="partial")
    target.load_state_dict(torch.load(best, weights_only=True)["state_dict"])
    datamodule = instantiate(cfg.data, _convert_="all")
    datamodule.prepare_data()
    datamodule.setup("test")
    batches = [datamodule.pixel_batch(batch, 0) for batch in datamodule.test_dataloader()]
    evaluation = instantiate(cfg.attack, source=str(best))
    result = evaluation.run(PixelClassifier(target, datamodule.input_transform),
                            PixelClassifier(source, datamodule.input_transform), batches, num_classes=10)  # fmt: skip
    assert evaluation.name == "fgsm_blackbox"
    assert result.accuracy == pytest.approx(_curve(attacked_run, "attack/bim/fgsm_acc"), abs=1e-6)


@pytest.mark.parametrize(
    "model,extra,method",
    [("lenet5", [], "pgd"), ("baseline_cnn", ["model.net.conv_layers=[8,8]", "model.net.hidden_sizes=[16]"], "bim"),
     ("capsnet", ["model.net.routing.iterations=2"], "fgsm"), ("em_caps_small", TINY_EM_CAPS, "bim")],
)  # fmt: skip
def test_the_attacks_run_on_every_model(model, extra, method):
    cfg = compose_config([f"model={model}", *extra])
    module = instantiate(cfg.model, _convert_="partial")
    evaluation = AdversarialEvaluation(method=method, eps=[0.0, 0.2], steps=2, targeted=method == "bim", examples=3)
    pixels = torch.rand(6, 1, 28, 28)
    labels = torch.arange(6)
    batches = [(pixels[:4], labels[:4]), (pixels[4:], labels[4:])]
    result = evaluation.run(PixelClassifier(module, lambda x: x), None, batches, num_classes=10)
    with torch.no_grad():
        clean = (PixelClassifier(module.eval(), lambda x: x)(pixels).argmax(1) == labels).double().mean().item()
    assert result.images == 6 and result.accuracy[0] == result.clean_accuracy == pytest.approx(clean)
    assert all(0 <= a <= 1 for a in result.accuracy)
    assert result.examples.shape == (2, 3, 1, 28, 28)
    assert (result.examples[0] == pixels[:3]).all()  # eps 0 leaves the images as they are
    assert (result.examples[1] - pixels[:3]).abs().max() <= 0.2 + 1e-6
    assert (result.target_rate is not None) == (method == "bim")
    assert (result.fgsm_accuracy is None) == (method == "fgsm")
    assert 0 <= result.unseen_input_fraction <= result.zero_gradient_fraction
    # Positions no output depends on: none for LeNet5 (padded 5x5 convolutions, pooling by 2);
    # CapsNet's 9x9 convolutions (the second of stride 2) never reach the last row and column.
    never_seen = {"lenet5": 0.0, "capsnet": (28 * 28 - 27 * 27) / (28 * 28)}
    if model in never_seen:
        assert result.unseen_input_fraction == pytest.approx(never_seen[model])


def test_a_source_outside_a_run_folder_or_of_other_data_is_refused(attacked_run, tmp_path):
    cfg = compose_config(["attack=fgsm"])
    loose = tmp_path / "loose.ckpt"
    loose.write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"no run config at .*\.hydra/config\.yaml"):
        source_classifier(str(loose), cfg)
    best = next(path for path in (attacked_run / "checkpoints").glob("*.ckpt") if path.name != "last.ckpt")
    with pytest.raises(ConfigError, match=r"was trained on other data \(.*image_size 28.*\) than this run's \("):
        source_classifier(str(best), compose_config(["data=smallnorb", "attack=fgsm"]))


def test_a_source_of_the_same_data_is_built_with_its_weights_when_the_geometry_is_interpolated(tmp_path):
    # smallNORB's channels are an interpolation (${stereo_channels:...}): compared resolved on both sides.
    from omegaconf import OmegaConf

    cfg = compose_config(["data=smallnorb", "attack=fgsm"])
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / "checkpoints").mkdir()
    OmegaConf.save(cfg, run / ".hydra" / "config.yaml")
    module = instantiate(cfg.model, _convert_="partial")
    torch.save({"state_dict": module.state_dict(), "pytorch-lightning_version": "2.6"}, run / "checkpoints" / "a.ckpt")
    source = source_classifier(str(run / "checkpoints" / "a.ckpt"), cfg)
    assert all(
        torch.equal(a, b) for a, b in zip(source.state_dict().values(), module.state_dict().values(), strict=True)
    )
