"""shifted_mnist, rotated_mnist and translated_mnist: augmentation on the device, one test set per angle,
digits placed on a canvas."""

from __future__ import annotations

import pytest
import torch

from capsexp.data import MNISTDataModule
from capsexp.data.augment import random_placement, random_shift, rotate
from capsexp.records.metric_names import PLAIN, metric_suffix, metrics_of_test_sets, rotation_angle, rotation_set_name
from tests.helpers import FakeTrainer, compose_config


def test_random_shift_moves_each_image_by_at_most_max_shift_with_zero_padding():
    images = torch.zeros(500, 1, 9, 9)
    images[:, :, 4, 4] = 1.0
    shifted = random_shift(images, 2, generator=torch.Generator().manual_seed(0))
    assert shifted.shape == images.shape and torch.equal(shifted.sum(dim=(1, 2, 3)), torch.ones(500))
    rows, cols = (
        shifted[:, 0].flatten(1).argmax(dim=1).div(9, rounding_mode="floor"),
        shifted[:, 0].flatten(1).argmax(dim=1) % 9,
    )
    dy, dx = rows - 4, cols - 4
    assert dy.abs().max() == 2 and dx.abs().max() == 2
    assert len(set(zip(dy.tolist(), dx.tolist(), strict=True))) == 25, "every shift in [-2, 2]^2 must occur"
    # Content pushed past the border is lost, and zeros come in: no wrap-around.
    edge = torch.zeros(1, 1, 5, 5)
    edge[0, 0, 0, :] = 1.0
    out = torch.stack([random_shift(edge, 2)[0] for _ in range(50)])
    assert out[:, 0, 4].sum() == 0 and out.amax() == 1.0


def test_shift_applies_to_training_batches_only(mnist_dir):
    datamodule = MNISTDataModule(
        mnist_dir, batch_size=50, val_size=50, verify_checksums=False, download=False, train_shift=2
    )
    datamodule.trainer = trainer = FakeTrainer(training=True)
    datamodule.prepare_data()
    datamodule.setup("fit")
    batch = next(iter(datamodule.val_dataloader()))
    plain = batch[0].float() / 255
    torch.manual_seed(0)
    trained, _ = datamodule.on_after_batch_transfer(batch, 0)
    assert not torch.equal(trained, plain)
    trainer.training = False
    evaluated, _ = datamodule.on_after_batch_transfer(batch, 0)
    assert torch.equal(evaluated, plain)


def test_random_placement_keeps_the_whole_digit_and_reaches_every_position():
    digits = torch.rand(3000, 1, 4, 3) + 0.1  # no zero pixel: a digit's extent is visible
    placed = random_placement(digits, 7, torch.Generator().manual_seed(0))
    assert placed.shape == (3000, 1, 7, 7)
    assert torch.allclose(placed.sum((1, 2, 3)), digits.sum((1, 2, 3)))  # nothing cut off
    inked = placed[:, 0] > 0
    tops, lefts = inked.any(2).float().argmax(1), inked.any(1).float().argmax(1)
    assert set(tops.tolist()) == set(range(4)) and set(lefts.tolist()) == set(range(5))  # 7-4+1, 7-3+1
    with pytest.raises(ValueError, match="canvas=3 is smaller than the 4x3 images"):
        random_placement(digits, 3)


def test_translated_mnist_places_training_digits_anew_and_evaluation_digits_once(mnist_dir):
    def made(**options) -> MNISTDataModule:
        datamodule = MNISTDataModule(
            mnist_dir, batch_size=50, val_size=50, verify_checksums=False, download=False, canvas=40, **options
        )
        datamodule.trainer = FakeTrainer()
        datamodule.prepare_data()
        datamodule.setup()
        return datamodule

    data, again, reseeded = made(), made(), made(placement_seed=1)
    assert data.dims == (1, 40, 40) and data.data_test.images.shape[1:] == (1, 40, 40)
    assert torch.equal(data.data_val.images, again.data_val.images)
    assert torch.equal(data.data_test.images, again.data_test.images)
    assert not torch.equal(data.data_test.images, reseeded.data_test.images)
    plain = MNISTDataModule(mnist_dir, verify_checksums=False, download=False)
    plain.setup("test")
    assert torch.equal(data.data_test.images.sum((1, 2, 3)), plain.data_test.images.sum((1, 2, 3)))  # whole digits
    data.trainer.training = True
    batch = next(iter(data.train_dataloader()))
    first, _ = data.on_after_batch_transfer(batch, 0)
    data.trainer.global_step = 1
    later, _ = data.on_after_batch_transfer(batch, 0)
    assert first.shape == (50, 1, 40, 40) and not torch.equal(first, later)
    assert torch.allclose(first.sum((1, 2, 3)), later.sum((1, 2, 3)))
    with pytest.raises(ValueError, match="train_shift=2 with canvas=40: choose one"):
        MNISTDataModule(canvas=40, train_shift=2)


def test_rotation_by_90_degrees_is_exact():
    images = torch.rand(3, 1, 12, 12)
    assert torch.allclose(rotate(images, 90), torch.rot90(images, 1, dims=(2, 3)), atol=1e-5)
    assert torch.equal(rotate(images, 0), images)


def test_rotated_mnist_has_one_test_loader_and_metric_name_per_angle(mnist_dir):
    datamodule = MNISTDataModule(
        mnist_dir, batch_size=25, verify_checksums=False, download=False, test_rotations=[0, 22.5, 90]
    )
    datamodule.trainer = FakeTrainer(testing=True)
    datamodule.prepare_data()
    datamodule.setup("test")
    loaders = datamodule.test_dataloader()
    assert len(loaders) == 3 and datamodule.test_set_names == ["rot0", "rot22.5", "rot90"]
    batch = next(iter(loaders[2]))
    upright, _ = datamodule.on_after_batch_transfer(batch, 0)
    turned, _ = datamodule.on_after_batch_transfer(batch, 2)
    assert torch.allclose(turned, torch.rot90(upright, 1, dims=(2, 3)), atol=1e-5)


@pytest.mark.parametrize(
    "data,key,value",
    [
        ("shifted_mnist", "train_shift", 2),
        ("rotated_mnist", "test_rotations", [0, 15, 30, 45, 60, 75, 90]),
        ("translated_mnist", "canvas", 40),
    ],
)
def test_variant_configs(data, key, value):
    cfg = compose_config([f"data={data}"])
    assert cfg.data[key] == value and cfg.data._target_ == "capsexp.data.MNISTDataModule"


def test_capsnet_selects_the_official_lr_schedule_unless_overridden():
    assert compose_config(["model=capsnet"]).model.lr_scheduler.scheduler.decay_steps == 2000
    assert not compose_config(["model=capsnet", "model/lr_scheduler=none"]).model.lr_scheduler
    assert not compose_config(["model=lenet5"]).model.lr_scheduler


def test_brightness_and_contrast_jitter_stay_in_their_ranges():
    from capsexp.data.augment import random_brightness_contrast

    torch.manual_seed(0)
    flat = torch.full((400, 2, 8, 8), 0.5)  # contrast leaves a constant image alone: only brightness acts
    shifted = random_brightness_contrast(flat, 0.25, (0.2, 1.8)) - 0.5
    assert shifted.abs().max() <= 0.25 + 1e-6 and shifted.abs().max() > 0.2
    assert torch.allclose(shifted.amin(dim=(1, 2, 3)), shifted.amax(dim=(1, 2, 3)))  # one offset per image
    textured = torch.rand(400, 2, 8, 8)
    scaled = random_brightness_contrast(textured, 0.0, (0.2, 1.8))
    deviation = lambda x: x - x.mean(dim=(-2, -1), keepdim=True)  # noqa: E731
    factors = deviation(scaled).flatten(1).norm(dim=1) / deviation(textured).flatten(1).norm(dim=1)
    assert factors.min() >= 0.2 - 1e-5 and factors.max() <= 1.8 + 1e-5
    assert factors.max() - factors.min() > 1.2


def test_random_crop_and_center_crop():
    from capsexp.data.augment import center_crop, random_crop

    images = torch.arange(48 * 48, dtype=torch.float32).view(1, 1, 48, 48).repeat(300, 1, 1, 1)
    crops = random_crop(images, 32)
    corners = crops[:, 0, 0, 0].long()
    rows, cols = corners // 48, corners % 48
    assert crops.shape == (300, 1, 32, 32) and rows.max() == 16 and cols.max() == 16 and rows.min() == 0
    assert torch.equal(crops[:, 0, 31, 31].long(), corners + 31 * 48 + 31)  # each crop is contiguous
    assert center_crop(images[:1], 32)[0, 0, 0, 0].item() == 8 * 48 + 8


def test_test_set_names_round_trip_through_the_metric_names():
    """The contract of capsexp.records.metric_names: what the DataModule declares is what compare reads back."""
    names = [PLAIN, rotation_set_name(22.5), rotation_set_name(-30)]
    assert names == ["", "rot22.5", "rot-30"]
    metrics = metrics_of_test_sets(names)
    assert metrics == [
        "test/acc",
        "test/loss",
        "test/acc_rot22.5",
        "test/loss_rot22.5",
        "test/acc_rot-30",
        "test/loss_rot-30",
    ]
    assert [rotation_angle(m) for m in metrics if rotation_angle(m) is not None] == [22.5, -30.0]
    assert rotation_angle("test/loss_rot30") is None and metric_suffix(PLAIN) == ""
