"""shifted_mnist and rotated_mnist: augmentation on the device, one test set per angle."""

from __future__ import annotations

import pytest
import torch

from capsexp.data import MNISTDataModule
from capsexp.data.augment import random_shift, rotate
from conftest import compose_config


def test_random_shift_moves_each_image_by_at_most_max_shift_with_zero_padding():
    images = torch.zeros(500, 1, 9, 9)
    images[:, :, 4, 4] = 1.0
    shifted = random_shift(images, 2, generator=torch.Generator().manual_seed(0))
    assert shifted.shape == images.shape and torch.equal(shifted.sum(dim=(1, 2, 3)), torch.ones(500))
    rows, cols = shifted[:, 0].flatten(1).argmax(dim=1).div(9, rounding_mode="floor"), shifted[:, 0].flatten(1).argmax(dim=1) % 9
    dy, dx = rows - 4, cols - 4
    assert dy.abs().max() == 2 and dx.abs().max() == 2
    assert len(set(zip(dy.tolist(), dx.tolist()))) == 25, "every shift in [-2, 2]^2 must occur"
    # Content pushed past the border is lost, and zeros come in: no wrap-around.
    edge = torch.zeros(1, 1, 5, 5)
    edge[0, 0, 0, :] = 1.0
    out = torch.stack([random_shift(edge, 2)[0] for _ in range(50)])
    assert out[:, 0, 4].sum() == 0 and out.amax() == 1.0


def test_shift_applies_to_training_batches_only(mnist_dir):
    class FakeTrainer:
        world_size = 1
        training = True
        testing = False

    datamodule = MNISTDataModule(mnist_dir, batch_size=50, val_size=50, verify_checksums=False,
                                 download=False, train_shift=2)
    datamodule.trainer = FakeTrainer()
    datamodule.prepare_data()
    datamodule.setup("fit")
    batch = next(iter(datamodule.val_dataloader()))
    plain = batch[0].float() / 255
    torch.manual_seed(0)
    trained, _ = datamodule.on_after_batch_transfer(batch, 0)
    assert not torch.equal(trained, plain)
    FakeTrainer.training = False
    evaluated, _ = datamodule.on_after_batch_transfer(batch, 0)
    assert torch.equal(evaluated, plain)


def test_rotation_by_90_degrees_is_exact():
    images = torch.rand(3, 1, 12, 12)
    assert torch.allclose(rotate(images, 90), torch.rot90(images, 1, dims=(2, 3)), atol=1e-5)
    assert torch.equal(rotate(images, 0), images)


def test_rotated_mnist_has_one_test_loader_and_metric_name_per_angle(mnist_dir):
    class FakeTrainer:
        world_size = 1
        training = False
        testing = True

    datamodule = MNISTDataModule(mnist_dir, batch_size=25, verify_checksums=False, download=False,
                                 test_rotations=[0, 22.5, 90])
    datamodule.trainer = FakeTrainer()
    datamodule.prepare_data()
    datamodule.setup("test")
    loaders = datamodule.test_dataloader()
    assert len(loaders) == 3 and datamodule.test_set_names == ["rot0", "rot22.5", "rot90"]
    batch = next(iter(loaders[2]))
    upright, _ = datamodule.on_after_batch_transfer(batch, 0)
    turned, _ = datamodule.on_after_batch_transfer(batch, 2)
    assert torch.allclose(turned, torch.rot90(upright, 1, dims=(2, 3)), atol=1e-5)


@pytest.mark.parametrize("data,key,value", [("shifted_mnist", "train_shift", 2),
                                            ("rotated_mnist", "test_rotations", [0, 15, 30, 45, 60, 75, 90])])
def test_variant_configs(data, key, value):
    cfg = compose_config([f"data={data}"])
    assert cfg.data[key] == value and cfg.data._target_ == "capsexp.data.MNISTDataModule"


def test_capsnet_selects_the_official_lr_schedule_unless_overridden():
    assert compose_config(["model=capsnet"]).lr_scheduler.scheduler.decay_steps == 2000
    assert compose_config(["model=capsnet", "lr_scheduler=none"]).lr_scheduler is None
    assert compose_config(["model=lenet5"]).lr_scheduler is None
