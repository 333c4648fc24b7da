"""Adversarial attacks on trained checkpoints (attack=fgsm|bim|pgd): what the sweep measures, on
every model, white-box and black-box, and the errors a user gets."""

from __future__ import annotations

import dataclasses
import functools
import io
import logging
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import PIL.Image
import pytest
import torch
from hydra.utils import instantiate
from lightning.pytorch.loggers import TensorBoardLogger

from capsexp.attacks import AdversarialEvaluation, AttackResult, PixelClassifier
from capsexp.attacks import evaluation as evaluation_module
from capsexp.attacks.evaluation import eps_step, metric_name, results_table, write_results
from capsexp.data import MNISTDataModule
from capsexp.errors import CheckpointError, ConfigError
from capsexp.records.events import load_events
from capsexp.run.attack import attack_tested_model, log_to_tensorboard, pixel_batches, source_classifier
from tests.helpers import TINY_EM_CAPS, TINY_RUN, FakeTrainer, compose_config, run_cli_in_process, scalars

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
    assert (
        "`bim`, white-box (crafted on the tested model), on the first test set of `MNISTDataModule`; model `LeNet5`."
        in page
    )
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
    loose = tmp_path / "loose.ckpt"  # a Lightning checkpoint without its run's record, outside a run folder
    torch.save({"state_dict": {}, "pytorch-lightning_version": "2.6.0"}, loose)
    with pytest.raises(
        CheckpointError, match=r"^attack\.source=\S+loose\.ckpt: no run config at .*\.hydra/config\.yaml"
    ):
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
    # The same interpolations, other values: other data.
    smaller = compose_config(["data=smallnorb", "data.crop_size=24", "attack=fgsm"])
    with pytest.raises(ConfigError) as refused:
        source_classifier(str(run / "checkpoints" / "a.ckpt"), smaller)
    assert re.fullmatch(
        r"attack\.source=\S+a\.ckpt was trained on other data \(.*image_size 32.*\) than this run's "
        r"\(.*image_size 24.*\): a black-box attack needs a source trained on the same inputs",
        str(refused.value),
    )


class LinearTwoClass(torch.nn.Module):
    """Scores (s, -s), s = w . x over a 2x2 image: an L-inf step of eps against the true class moves s by
    eps ||w||_1 (each pixel by eps against the sign of its weight), so every attack result is known in
    advance. The last pixel has weight 0: its gradient is 0 on every image (an unseen input)."""

    weight = torch.tensor([2.0, -1.0, 0.5, 0.0])

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        s = images.flatten(1) @ self.weight
        return torch.stack([s, -s], dim=1)


def test_attack_results_match_a_linear_model_worked_out_by_hand(caplog):
    torch.manual_seed(0)
    pixels = 0.35 + 0.3 * torch.rand(10, 1, 2, 2)  # eps <= 0.3 never reaches the pixel range's ends
    standardise = lambda x: 2 * x - 1  # noqa: E731  (the DataModule's input transform)
    w, norm = LinearTwoClass.weight, LinearTwoClass.weight.abs().sum()
    s = standardise(pixels).flatten(1) @ w
    labels = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1, 1, 0])  # about half of them wrong before any attack
    batches = [(pixels[i : i + 4], labels[i : i + 4]) for i in range(0, 10, 4)]  # batches of 4, 4, 2
    eps = [0.0, 0.005, 0.05, 0.3]
    model = PixelClassifier(LinearTwoClass(), standardise)
    for method, targeted in (("fgsm", False), ("bim", False), ("bim", True)):
        evaluation = AdversarialEvaluation(method=method, eps=eps, targeted=targeted, max_images=7, examples=6)
        result = evaluation.run(model, None, batches, num_classes=2)
        seen_s, seen_labels = s[:7], labels[:7]  # the first 7 images, across the batch boundary
        margin = torch.where(seen_labels == 0, seen_s, -seen_s)  # > 0: right
        # Through the transform 2x - 1 a pixel step of eps moves s by 2 eps ||w||_1.
        expected = [(margin > 2 * e * norm).double().mean().item() for e in eps]
        assert result.images == 7 and result.clean_accuracy == pytest.approx(expected[0])
        assert result.accuracy == pytest.approx(expected)
        assert expected == sorted(set(expected), reverse=True)  # 4/7, 3/7, 1/7, 0: the eps told apart
        # The 10 BIM steps of 0.2 eps reach the ball's corner, where one FGSM step lands.
        assert result.fgsm_accuracy == (None if method == "fgsm" else pytest.approx(expected))
        # Two classes: the target is the other class, and every image not right is on it.
        assert result.target_rate == (pytest.approx([1 - a for a in expected]) if targeted else None)
        assert result.zero_gradient_fraction == result.unseen_input_fraction == 0.25
        # The first 6 adversarial images at each eps (two batches): each pixel moved by eps against the
        # true class.
        away = torch.where(labels[:6, None] == 0, -1.0, 1.0) * w.sign()  # (6, 4)
        moved = torch.stack([pixels[:6].flatten(1) + e * away for e in eps]).view(4, 6, 1, 2, 2)
        torch.testing.assert_close(result.examples, moved)
    assert evaluation.name == "bim_targeted"
    assert not [r for r in caplog.records if r.levelname == "WARNING"]  # no masking here


class GatedPixels(torch.nn.Module):
    """Two classes, s = x0 + 3 relu(x1 - 0.5) + 3 relu(x3 - 0.5): pixels 1 and 3 have a zero gradient on an
    image where they are at most 0.5 (their gate shut), so whether it is zero on every image depends
    on the images; pixel 2 has no weight (zero everywhere), pixel 0 never a zero gradient."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        flat = images.flatten(1)
        s = flat[:, 0] + 3 * torch.relu(flat[:, 1] - 0.5) + 3 * torch.relu(flat[:, 3] - 0.5)
        return torch.stack([s, -s], dim=1)


def test_an_input_is_unseen_only_where_its_gradient_is_zero_on_every_image_of_every_batch():
    shut = torch.full((4, 1, 2, 2), 0.2)
    first, second = shut.clone(), shut.clone()
    first.view(4, 4)[:2, 3] = 0.9  # pixel 3 open on two images of the first batch
    second.view(4, 4)[:2, 1] = 0.9  # pixel 1 on two of the second
    labels = torch.zeros(4, dtype=torch.long)
    batches = [(first, labels), (second, labels), (shut, labels)]
    result = AdversarialEvaluation(eps=[0.0]).run(PixelClassifier(GatedPixels(), lambda x: x), None, batches, 2)
    assert result.unseen_input_fraction == 0.25  # pixel 2 only
    # zero gradients: pixel 2 on all 12 images, pixels 1 and 3 on 10 each
    assert result.zero_gradient_fraction == (12 + 10 + 10) / 48


def test_a_long_attack_logs_its_progress_every_30_seconds(monkeypatch, caplog):
    clock = iter([5.0, 35.0, 36.5, 36.5, 45.0])  # the start, then after each batch (and for its line)
    monkeypatch.setattr(evaluation_module.time, "monotonic", lambda: next(clock))
    pixels, labels = torch.full((4, 1, 2, 2), 0.5), torch.zeros(4, dtype=torch.long)
    with caplog.at_level(logging.INFO, logger="capsexp.attacks.evaluation"):
        AdversarialEvaluation(eps=[0.0]).run(
            PixelClassifier(LinearTwoClass(), lambda x: x), None, [(pixels, labels)] * 3, 2
        )
    # 30 s after the start: not more than 30, no line; 31.5 s: 8 images in 31.5 s; then 8.5 s: none.
    assert [r.getMessage() for r in caplog.records] == ["attack fgsm: 8 images, 0.3 img/s"]


class LinearThreeClass(torch.nn.Module):
    """Three classes, scores W x over a 2x2 image."""

    weight = torch.tensor([[3.0, 0.0, 0.0, 0.0], [0.0, 3.0, 0.0, 0.0], [0.0, 0.0, 3.0, 0.0]])

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return images.flatten(1) @ self.weight.T


def test_a_targeted_attack_aims_at_the_class_its_seeded_offset_names():
    """The target of each image: (label + offset) mod classes, the offset drawn uniformly in 1 .. classes-1
    from a generator seeded by attack.seed, batch after batch."""
    pixels = torch.full((12, 1, 2, 2), 0.5)
    labels = torch.arange(12) % 3
    pixels.view(12, 4)[torch.arange(12), labels] = 0.7  # each image its label's class, by a margin
    evaluation = AdversarialEvaluation(method="bim", eps=[0.4], targeted=True, seed=5, examples=12)
    result = evaluation.run(
        PixelClassifier(LinearThreeClass(), lambda x: x), None, [(pixels[:6], labels[:6]), (pixels[6:], labels[6:])], 3
    )
    replay = torch.Generator().manual_seed(5)
    goals = torch.cat([(labels[i : i + 6] + torch.randint(1, 3, (6,), generator=replay)) % 3 for i in (0, 6)])
    reached = LinearThreeClass()(result.examples[0]).argmax(1)
    assert torch.equal(reached, goals) and result.target_rate == [1.0]


def test_the_foolbox_attacks_take_the_evaluations_steps_step_size_and_random_start():
    bim = AdversarialEvaluation(method="bim", steps=7, relative_step=0.3)._foolbox_attack("bim")
    pgd = AdversarialEvaluation(method="pgd", steps=9, relative_step=0.05)._foolbox_attack("pgd")
    fgsm = AdversarialEvaluation(method="bim", steps=7)._foolbox_attack("fgsm")
    assert (bim.steps, bim.rel_stepsize, bim.random_start) == (7, 0.3, False)
    assert (pgd.steps, pgd.rel_stepsize, pgd.random_start) == (9, 0.05, True)
    assert (fgsm.steps, fgsm.rel_stepsize, fgsm.random_start) == (1, 1.0, False)  # one step of the whole eps


def test_an_empty_test_set_is_refused():
    with pytest.raises(ValueError, match=r"^the test set is empty: nothing to attack$"):
        AdversarialEvaluation().run(PixelClassifier(LinearTwoClass(), lambda x: x), None, [], num_classes=2)


# A targeted BIM sweep's result, written by hand: what the page and TensorBoard are checked on.
SWEEP = AttackResult(
    eps=[0.0, 0.1, 0.25],
    accuracy=[0.9, 0.55, 0.125],
    target_rate=[0.0, 0.3, 0.75],
    fgsm_accuracy=[0.9, 0.6, 0.2],
    clean_accuracy=0.9,
    zero_gradient_fraction=0.0125,
    unseen_input_fraction=0.005,
    images=40,
    examples=torch.zeros(3, 1, 1, 2, 2),
)


def test_the_attack_page_states_the_images_the_gradient_checks_and_each_eps(tmp_path):
    result = SWEEP
    path = write_results(result, "bim_targeted", tmp_path, "BIM on run X.")
    assert path == tmp_path / "attack_bim_targeted.md"
    assert path.read_text() == (
        "# Attack bim_targeted\n\nBIM on run X.\n\n"
        "40 test images; clean accuracy 90.00%; 1.25% of the crafting model's input gradients are exactly 0; "
        "0.50% of the input positions have a zero gradient on every image (the net never sees them).\n\n"
        "| eps | bim_targeted accuracy (%) | FGSM accuracy (%) | classified as the target (%) |\n"
        "| ---: | ---: | ---: | ---: |\n"
        "| 0 | 90.00 | 90.00 | 0.00 |\n"
        "| 0.1 | 55.00 | 60.00 | 30.00 |\n"
        "| 0.25 | 12.50 | 20.00 | 75.00 |\n"
    )
    plain = dataclasses.replace(result, target_rate=None, fgsm_accuracy=None)
    assert results_table(plain, "fgsm").splitlines() == [
        "| eps | fgsm accuracy (%) |",
        "| ---: | ---: |",
        "| 0 | 90.00 |",
        "| 0.1 | 55.00 |",
        "| 0.25 | 12.50 |",
    ]
    assert (
        metric_name("fgsm", 0.25) == "attack/fgsm/acc_eps0.25"
        and eps_step(0.25) == 250
        and eps_step(0.75) == 750
        and eps_step(0.0005) == 0
    )


def test_an_iterative_attack_weaker_than_fgsm_or_mostly_zero_gradients_warn(caplog):
    evaluation = AdversarialEvaluation(method="pgd", eps=[0.0, 0.1, 0.2])
    result = AttackResult(
        eps=[0.0, 0.1, 0.2],
        accuracy=[0.9, 0.5, 0.3],
        target_rate=None,
        fgsm_accuracy=[0.9, 0.4, 0.3],  # PGD worse than FGSM at 0.1 only (equal is fine)
        clean_accuracy=0.9,
        zero_gradient_fraction=0.75,
        unseen_input_fraction=0.125,
        images=10,
        examples=torch.zeros(3, 1, 1, 2, 2),
    )
    with caplog.at_level(logging.WARNING, logger="capsexp.attacks.evaluation"):
        evaluation._warn_if_masked(result)
    assert caplog.messages == [
        "pgd left more images right than FGSM at eps 0.1 (50.00% > 40.00%): an iterative attack weaker than one "
        "step is a sign of masked gradients",
        "75.0% of the input gradients are exactly zero: the attack's gradients may be masked (saturated scores)",
    ]
    caplog.clear()
    # Zero gradients where the net never looks are no sign of masking: 0.75 - 0.25 is not above one half.
    evaluation._warn_if_masked(dataclasses.replace(result, fgsm_accuracy=None, unseen_input_fraction=0.25))
    assert caplog.messages == []


def test_attacks_refuse_data_with_several_objects_per_image():
    evaluation = AdversarialEvaluation(method="bim")

    class MultiDigits:
        objects_per_image = 2

    class OneDigit:  # a DataModule that does not say: one object per image
        pass

    with pytest.raises(ConfigError, match=r"^attack=bim: the attacks score one object per image; MultiDigits has 2$"):
        attack_tested_model(None, evaluation, None, MultiDigits(), SimpleNamespace(), None)
    with pytest.raises(AttributeError, match="strategy"):  # past the check, on to the trainer's device
        attack_tested_model(None, evaluation, None, OneDigit(), SimpleNamespace(), None)


def test_a_black_box_attack_shows_the_source_models_examples_to_the_tested_model(attacked_run, tmp_path, caplog):
    """attack.source: the examples are crafted on the source checkpoint (the trained run) and shown to the
    tested model (here the same weights with noise added, so the two differ); the figures, the log and
    the page say so."""
    best = next(path for path in (attacked_run / "checkpoints").glob("*.ckpt") if path.name != "last.ckpt")
    cfg = compose_config([f"paths.data_dir={attacked_run.parents[3] / 'data'}", *TINY_RUN, "attack=fgsm", EPS])
    torch.manual_seed(1)
    tested = instantiate(cfg.model, _convert_="partial")
    tested.load_state_dict(torch.load(best, weights_only=True)["state_dict"])
    with torch.no_grad():
        for parameter in tested.parameters():
            parameter.add_(0.3 * parameter.std() * torch.randn_like(parameter))
    datamodule = instantiate(cfg.data, _convert_="all")
    datamodule.prepare_data()
    datamodule.setup("test")
    trainer = SimpleNamespace(
        strategy=SimpleNamespace(root_device=torch.device("cpu")), is_global_zero=True, loggers=[]
    )
    evaluation = instantiate(cfg.attack, source=str(best), targeted=True)
    with caplog.at_level(logging.INFO, logger="capsexp.run.attack"):
        metrics = attack_tested_model(cfg, evaluation, tested, datamodule, trainer, tmp_path)
    # Another process of a multi-device run attacks too, but writes no page.
    other_process = SimpleNamespace(**{**vars(trainer), "is_global_zero": False})
    assert attack_tested_model(cfg, evaluation, tested, datamodule, other_process, tmp_path / "rank1") == metrics
    assert not (tmp_path / "rank1").exists()
    batches = [datamodule.pixel_batch(batch, 0) for batch in datamodule.test_dataloader()]
    as_pixels = functools.partial(PixelClassifier, input_transform=datamodule.input_transform)
    source = source_classifier(str(best), cfg)
    black_box = evaluation.run(as_pixels(tested), as_pixels(source), batches, num_classes=10)
    white_box = evaluation.run(as_pixels(tested), None, batches, num_classes=10)
    name = "fgsm_targeted_blackbox"
    assert metrics == {
        f"attack/{name}/acc_eps{eps:g}": a for eps, a in zip([0, 0.1, 0.3], black_box.accuracy, strict=True)
    }
    assert black_box.accuracy != white_box.accuracy  # crafted on another model, other examples
    assert caplog.messages[0] == f"Attack {name}, crafted on {best}: eps 0, 0.1, 0.3"
    assert caplog.messages[1:5] == [
        *(f"  eps {e:g}: accuracy {100 * a:.2f}%" for e, a in zip([0, 0.1, 0.3], black_box.accuracy, strict=True)),
        f"Attack results: {tmp_path / f'attack_{name}.md'}",
    ]
    page = (tmp_path / f"attack_{name}.md").read_text()
    assert f"`fgsm` targeted, crafted on {best}, on the first test set of `MNISTDataModule`; model `LeNet5`." in page


@pytest.mark.parametrize("extra", [{"test_rotations": [0, 90]}, {"canvas": 40, "extra_test_sets": ["affine_mnist"]}])
def test_attacks_see_the_first_test_set_as_pixels_in_the_unit_range(mnist_dir, extra):
    """With several test sets (rotated copies, an extra set), an attack takes the first one, at angle
    0: the raw test digits (placed on the canvas where there is one), divided by 255."""
    datamodule = MNISTDataModule(mnist_dir, batch_size=32, verify_checksums=False, download=False, **extra)
    datamodule.trainer = FakeTrainer(testing=True)
    datamodule.prepare_data()
    datamodule.setup("test")
    assert len(datamodule.test_dataloader()) == 2
    batches = list(pixel_batches(datamodule, torch.device("cpu")))
    assert [len(labels) for _, labels in batches] == [32, 32, 32, 4]
    pixels = torch.cat([images for images, _ in batches])
    assert torch.equal(torch.cat([labels for _, labels in batches]), datamodule.data_test.targets)
    assert torch.equal(pixels, datamodule.data_test.images.float() / 255)


def test_the_attack_figures_in_tensorboard_are_per_eps_beside_fgsm_with_the_examples_a_row_per_eps(tmp_path):
    result = dataclasses.replace(SWEEP, examples=torch.rand(3, 4, 1, 5, 6))  # 3 eps x 4 images of 5x6 pixels
    logger = TensorBoardLogger(tmp_path, name="", version="")
    trainer = SimpleNamespace(is_global_zero=True, loggers=[logger])
    log_to_tensorboard(result, "bim_targeted", trainer)
    logged = {
        tag: [(point.step, pytest.approx(point.value)) for point in points] for tag, points in scalars(tmp_path).items()
    }
    steps = [0, 100, 250]  # eps x 1000
    assert logged == {
        "attack/bim_targeted/acc": list(zip(steps, result.accuracy, strict=True)),
        "attack/bim_targeted/fgsm_acc": list(zip(steps, result.fgsm_accuracy, strict=True)),
        "attack/bim_targeted/target_rate": list(zip(steps, result.target_rate, strict=True)),
        "attack/bim_targeted/zero_gradient_fraction": [(0, 0.0125)],
        "attack/bim_targeted/unseen_input_fraction": [(0, 0.005)],
    }
    (image,) = load_events(tmp_path, images=0).Images("attack/bim_targeted/examples")
    # make_grid: a row per eps, the 4 images side by side, 2 pixels of padding around each, white.
    assert (image.height, image.width, image.step) == (3 * (5 + 2) + 2, 4 * (6 + 2) + 2, 0)
    grid = np.asarray(PIL.Image.open(io.BytesIO(image.encoded_image_string)))
    assert (grid[:2] == 255).all() and (grid[:, :2] == 255).all()
    # Other DDP processes write nothing.
    log_to_tensorboard(result, "bim_targeted", SimpleNamespace(is_global_zero=False, loggers=[logger]))
    logger.experiment.flush()
    assert {tag: len(points) for tag, points in scalars(tmp_path).items()} == {tag: len(v) for tag, v in logged.items()}


def test_fgsm_is_one_signed_gradient_step_of_eps_on_any_model():
    """Goodfellow et al. 2015: x' = clip(x + eps sign(grad_x CE)), computed here with autograd on a
    nonlinear net, where a second step would go elsewhere."""
    torch.manual_seed(0)
    net = instantiate(compose_config(["model=lenet5"]).model.net)
    model = PixelClassifier(net, lambda x: 2 * x - 1)
    pixels, labels = torch.rand(6, 1, 28, 28), torch.arange(6)
    result = AdversarialEvaluation(method="fgsm", eps=[0.1], examples=6).run(model, None, [(pixels, labels)], 10)
    x = pixels.clone().requires_grad_(True)
    (gradient,) = torch.autograd.grad(torch.nn.functional.cross_entropy(model(x), labels, reduction="sum"), x)
    expected = (pixels + 0.1 * gradient.sign()).clamp(0, 1)
    torch.testing.assert_close(result.examples[0], expected, rtol=0, atol=1e-6)


def test_the_attack_recipes_are_foolboxs_defaults_and_the_documented_sweep():
    """What ``attack=fgsm|bim|pgd`` builds, and the Python defaults, against the values the configs cite:
    foolbox's L-inf BIM (10 steps of 0.2 eps) and PGD (40 steps of eps/30), seed 0, 8 examples kept."""
    common = dict(eps=[0.0, 0.05, 0.1, 0.2, 0.3, 0.5], targeted=False, source=None, max_images=None, seed=0, examples=8)
    expected = {
        "fgsm": dict(method="fgsm", steps=10, relative_step=0.2, **common),
        "bim": dict(method="bim", steps=10, relative_step=0.2, **common),
        "pgd": dict(method="pgd", steps=40, relative_step=0.0333, **common),
    }
    for name, values in expected.items():
        evaluation = instantiate(compose_config([f"attack={name}"]).attack)
        assert vars(evaluation) == values, name
    assert vars(AdversarialEvaluation()) == expected["fgsm"]


def test_iterative_attacks_have_fgsm_beside_them_and_their_random_draws_are_seeded():
    torch.manual_seed(0)
    net = instantiate(compose_config(["model=lenet5"]).model.net)
    model = PixelClassifier(net, lambda x: 2 * x - 1)
    pixels = torch.rand(32, 1, 28, 28)
    with torch.no_grad():
        labels = model(pixels).argmax(1)  # the model's own answers: all right before the attack
    x = pixels.clone().requires_grad_(True)
    (gradient,) = torch.autograd.grad(torch.nn.functional.cross_entropy(model(x), labels, reduction="sum"), x)
    with torch.no_grad():  # FGSM by hand, as in the test above, scored on the model
        fgsm = (model((pixels + 0.1 * gradient.sign()).clamp(0, 1)).argmax(1) == labels).double().mean().item()
    assert 0 < fgsm < 1  # some images turned, some not
    runs = []
    for method, targeted, global_seed in [("pgd", False, 1), ("pgd", False, 2), ("bim", True, 1), ("bim", True, 2)]:
        torch.manual_seed(global_seed)  # the run's own seed: the attack's draws must not depend on it
        evaluation = AdversarialEvaluation(method=method, eps=[0.1], steps=3, targeted=targeted, seed=4)
        runs.append(evaluation.run(model, None, [(pixels, labels)], num_classes=10))
    for result in runs[:2]:  # untargeted, as the FGSM by hand (a targeted attack's FGSM aims at the target)
        assert result.fgsm_accuracy == [pytest.approx(fgsm)]
    assert torch.equal(runs[0].examples, runs[1].examples)  # PGD's random start, seeded by attack.seed
    assert torch.equal(runs[2].examples, runs[3].examples) and runs[2].target_rate == runs[3].target_rate  # targets
