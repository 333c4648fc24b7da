"""Several objects per image (MultiMNIST, Sabour et al. 2017, section 6): the heads, losses and metrics."""

from __future__ import annotations

import functools
import io
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from capsexp.data import MultiMNISTDataModule
from capsexp.errors import ConfigError
from capsexp.figures.images import overlaid
from capsexp.lit import CapsuleLoss, Classifier, CrossEntropy, SpreadLoss
from capsexp.lit.classifier import target_and_largest_other
from capsexp.models import CapsNet
from capsexp.nn.functional import margin_loss
from capsexp.records.events import load_events
from tests.helpers import TINY_RUN, run_cli_in_process, scalars


class FixedScores(torch.nn.Module):
    """A 'net' whose class scores are given: to test what the Classifier makes of them."""

    def __init__(self, scores: torch.Tensor) -> None:
        super().__init__()
        self.scores = scores
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.scores + self.weight


def test_an_image_counts_as_right_only_when_both_of_its_digits_are_named():
    scores = torch.tensor(
        [
            [0.9, 0.8, 0.1, 0.0],  # top two {0, 1}
            [0.9, 0.1, 0.8, 0.0],  # top two {0, 2}
            [0.1, 0.9, 0.0, 0.8],  # top two {1, 3}
            [0.0, 0.1, 0.8, 0.9],  # top two {2, 3}
        ]
    )
    targets = torch.tensor([[1, 0], [0, 1], [3, 1], [0, 3]])  # right, one wrong, right, one wrong
    module = Classifier(FixedScores(scores), CrossEntropy(), functools.partial(torch.optim.SGD, lr=0.1), num_classes=4)
    module.log = lambda *args, **kwargs: None
    module._trainer = SimpleNamespace(datamodule=SimpleNamespace(objects_per_image=2))
    module.setup("fit")
    _, predicted, present = module._step((torch.zeros(4, 1, 2, 2), targets), "val")
    assert predicted.sum(1).tolist() == [2, 2, 2, 2] and present.sum(1).tolist() == [2, 2, 2, 2]
    assert module.val_acc(predicted, present).item() == 0.5
    # One object per image: the usual accuracy.
    module._trainer = SimpleNamespace(datamodule=SimpleNamespace(objects_per_image=1))
    module.setup("fit")
    _, predicted, present = module._step((torch.zeros(4, 1, 2, 2), torch.tensor([0, 2, 1, 3])), "val")
    assert module.val_acc(predicted, present).item() == 0.75


def test_the_margin_loss_counts_every_present_class():
    lengths, targets = torch.rand(5, 10), torch.tensor([[1, 4], [0, 9], [2, 3], [7, 8], [5, 6]])
    present = F.one_hot(targets, 10).sum(1).float()
    expected = present * F.relu(0.9 - lengths) ** 2 + 0.5 * (1 - present) * F.relu(lengths - 0.1) ** 2
    assert torch.allclose(margin_loss(lengths, targets), expected.sum(1).mean())


def test_the_baselines_use_independent_sigmoids_for_several_objects():
    scores, targets = torch.randn(6, 10), torch.randint(0, 5, (6, 2))
    targets[:, 1] += 5  # two different classes
    present = F.one_hot(targets, 10).sum(1).float()
    loss = CrossEntropy()(scores, torch.zeros(6, 1, 2, 2), targets)["loss"]
    assert torch.allclose(loss, F.binary_cross_entropy_with_logits(scores, present))
    single = CrossEntropy()(scores, torch.zeros(6, 1, 2, 2), targets[:, 0])["loss"]
    assert torch.allclose(single, F.cross_entropy(scores, targets[:, 0]))


def test_capsnet_reconstructs_each_digit_from_its_own_capsule():
    torch.manual_seed(0)
    net = CapsNet(image_size=36, conv_channels=16, primary_types=4, objects=2)
    images, targets = torch.rand(3, 1, 36, 36), torch.tensor([[1, 4], [0, 9], [2, 3]])
    trained = net(images, targets)
    assert trained.reconstructions.shape == (3, 2, 1, 36, 36)
    for k in range(2):  # training: the true classes' capsules, one each
        assert torch.allclose(trained.reconstructions[:, k], net.decode(trained.poses, targets[:, k]))
    evaluated = net(images)
    longest = evaluated.scores.topk(2, dim=-1).indices
    for k in range(2):  # evaluation: the two longest
        assert torch.allclose(evaluated.reconstructions[:, k], net.decode(evaluated.poses, longest[:, k]))
    # Both reconstruction losses, each against its own digit alone.
    objects = torch.rand(3, 2, 1, 36, 36)
    terms = CapsuleLoss()(trained, objects, targets)
    expected = sum((trained.reconstructions[:, k] - objects[:, k]).pow(2).sum((1, 2, 3)) for k in range(2)).mean()
    assert torch.allclose(terms["recon_loss"], expected)


def test_presence_takes_the_weaker_present_class_and_the_strongest_absent_one():
    scores = torch.tensor([[0.9, 0.6, 0.3, 0.1]])
    assert torch.equal(target_and_largest_other(scores, torch.tensor([[0, 1]])), scores[:, [1, 2]])
    assert torch.equal(target_and_largest_other(scores, torch.tensor([1])), scores[:, [1, 0]])


def test_objects_are_overlaid_in_colours():
    reconstructions = torch.rand(4, 2, 1, 5, 5)
    colour = overlaid(reconstructions)
    assert colour.shape == (4, 3, 5, 5) and torch.equal(colour[:, 0], reconstructions[:, 0, 0])
    assert torch.equal(colour[:, 1], reconstructions[:, 1, 0]) and not colour[:, 2].any()
    three = torch.rand(4, 3, 1, 5, 5)  # as many objects as colours: each its own
    assert torch.equal(overlaid(three), three[:, :, 0])
    for shape in [(4, 4, 1, 5, 5), (4, 2, 3, 5, 5)]:  # more objects than colours; colour reconstructions
        with pytest.raises(
            ValueError, match=rf"^can overlay up to 3 one-channel reconstructions, got \({shape[1]}, {shape[2]}\)$"
        ):
            overlaid(torch.rand(shape))


def test_capsnet_trains_on_multi_mnist_from_the_command_line(mnist_dir, tmp_path):
    result = run_cli_in_process(
        *TINY_RUN,
        "model=capsnet",
        "data=multi_mnist",
        f"paths.data_dir={mnist_dir}",
        "data.val_size=50",
        "trainer.max_epochs=1",
        "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1",
        "model.net.conv_channels=16",
        "model.net.primary_types=4",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    logged = scalars(tmp_path)
    for tag in ["train/margin_loss_step", "train/recon_loss_step", "val/acc", "test/acc", "val/presence_gap"]:
        assert tag in logged, (tag, sorted(logged))
    margin = [s.value for s in logged["train/margin_loss_step"]]
    assert np.mean(margin[-5:]) < np.mean(margin[:5])  # it learns
    # Fig. 5 of the paper: inputs above the two digits' reconstructions, one colour each.
    figure = load_events(tmp_path, images=0).Images("val/reconstructions")[-1]
    pixels = np.asarray(Image.open(io.BytesIO(figure.encoded_image_string)).convert("RGB")).astype(int)
    bottom = pixels[pixels.shape[0] // 2 + 2 :]
    assert bottom[..., 0].max() > 0 and bottom[..., 1].max() > 0 and (bottom[..., 0] != bottom[..., 1]).any()


def test_an_objective_for_one_class_is_refused_for_two_objects(mnist_dir):
    module = Classifier(FixedScores(torch.zeros(1, 10)), SpreadLoss(), functools.partial(torch.optim.SGD, lr=0.1))
    module.trainer = SimpleNamespace(datamodule=MultiMNISTDataModule(mnist_dir))
    with pytest.raises(ConfigError, match="SpreadLoss scores one class per image, but MultiMNISTDataModule has 2"):
        module.setup("fit")
