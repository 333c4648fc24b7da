"""Every data mode, built from its config as a run builds it, against the raw IDX files it reads: the
images and labels a model is given (after the on-device augmentation) are checked against the files'
bytes, read here by a reader of its own, and against the transformation each mode documents,
computed independently (numpy for shifts, placements, downsampling and standardisation, torchvision for
rotations)."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as TF
from hydra.utils import instantiate
from torchvision.transforms import InterpolationMode

from capsexp.data.base import evaluation_generator
from tests.helpers import FakeTrainer, compose_config


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzipped), as its format defines it: zero bytes, type 0x08 (uint8), the number of
    dimensions, each dimension as a big-endian int32, then the values."""
    data = gzip.decompress(path.read_bytes())
    assert data[:3] == b"\x00\x00\x08"
    ndim = data[3]
    shape = struct.unpack(f">{ndim}i", data[4 : 4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def raw_mnist(data_dir: Path, train: bool) -> tuple[np.ndarray, np.ndarray]:
    prefix = "train" if train else "t10k"
    raw = data_dir / "MNIST" / "raw"
    return read_idx(raw / f"{prefix}-images-idx3-ubyte.gz"), read_idx(raw / f"{prefix}-labels-idx1-ubyte.gz")


def datamodule_of(data: str, data_dir: Path, **overrides):
    """The DataModule of ``data=<data>``, as the config builds it, on the test's files."""
    cfg = compose_config([f"data={data}", f"paths.data_dir={data_dir}", "data.verify_checksums=false"])
    cfg.data.update({"val_size": 60, "batch_size": 50, "download": False, **overrides})
    datamodule = instantiate(cfg.data)
    datamodule.trainer = FakeTrainer()
    datamodule.prepare_data()
    datamodule.setup(None)
    return datamodule


def model_inputs(datamodule, loader, stage: str, dataloader_idx: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every batch of ``loader`` as the model receives it in ``stage``: (the loader's stored uint8 images,
    the model's float images, the labels), all batches concatenated; one-channel images as (N, H, W)."""
    trainer = datamodule.trainer
    trainer.training, trainer.testing = stage == "train", stage == "test"
    stored, given, labels = [], [], []
    for step, (images, targets) in enumerate(loader):
        trainer.global_step = step  # training augmentations draw per step
        model_images, model_targets = datamodule.on_after_batch_transfer((images, targets), dataloader_idx)
        stored.append(images.numpy())
        given.append(model_images.numpy())
        labels.append(model_targets.numpy())
    stored, given = np.concatenate(stored), np.concatenate(given)
    if stored.shape[1] == 1:  # one channel: (N, H, W), as the IDX files hold them
        stored, given = stored[:, 0], given[:, 0]
    return stored, given, np.concatenate(labels)


def raw_index(raw_images: np.ndarray) -> dict[bytes, int]:
    """Each raw image's bytes -> its index in the file (the synthetic digits are all different)."""
    index = {image.tobytes(): i for i, image in enumerate(raw_images)}
    assert len(index) == len(raw_images)
    return index


def check_split_of_the_training_file(datamodule, data_dir: Path) -> np.ndarray:
    """Validation and training images are the training file's, each with its own label, together every
    one of them once, ``val_size`` of them for validation; returns the training images' indices in the file."""
    raw_images, raw_labels = raw_mnist(data_dir, train=True)
    index = raw_index(raw_images)
    val_stored, _, val_labels = model_inputs(datamodule, datamodule.val_dataloader(), "validate")
    train_stored, _, train_labels = model_inputs(datamodule, datamodule.train_dataloader(), "train")
    val_at = np.array([index[image.tobytes()] for image in val_stored])
    train_at = np.array([index[image.tobytes()] for image in train_stored])
    assert len(val_at) == datamodule.hparams.val_size
    assert sorted([*val_at, *train_at]) == list(range(len(raw_images)))
    assert np.array_equal(val_labels, raw_labels[val_at]) and np.array_equal(train_labels, raw_labels[train_at])
    return train_at


def shifted(image: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """``image`` moved down by dy and right by dx pixels, zeros coming in (nothing wraps round)."""
    height, width = image.shape
    out = np.zeros_like(image)
    out[max(dy, 0) : height + min(dy, 0), max(dx, 0) : width + min(dx, 0)] = image[
        max(-dy, 0) : height + min(-dy, 0), max(-dx, 0) : width + min(-dx, 0)
    ]
    return out


def test_mnist_gives_the_files_pixels_scaled_to_the_unit_range(mnist_dir):
    datamodule = datamodule_of("mnist", mnist_dir)
    train_at = check_split_of_the_training_file(datamodule, mnist_dir)
    raw_train, _ = raw_mnist(mnist_dir, train=True)
    _, train_given, _ = model_inputs(datamodule, datamodule.train_dataloader(), "train")
    assert np.array_equal(train_given, raw_train[train_at].astype(np.float32) / 255)  # no augmentation
    raw_test, raw_test_labels = raw_mnist(mnist_dir, train=False)
    test_stored, test_given, test_labels = model_inputs(datamodule, datamodule.test_dataloader(), "test")
    assert np.array_equal(test_stored, raw_test) and np.array_equal(test_labels, raw_test_labels)  # file order
    assert np.array_equal(test_given, raw_test.astype(np.float32) / 255)


def test_mnist_normalize_standardises_with_mnists_mean_and_std(mnist_dir):
    datamodule = datamodule_of("mnist", mnist_dir, normalize=True)
    raw_test, _ = raw_mnist(mnist_dir, train=False)
    _, test_given, _ = model_inputs(datamodule, datamodule.test_dataloader(), "test")
    # The mean and std of the 60,000 official training images' pixels in [0, 1] (torchvision's MNIST example).
    expected = (raw_test.astype(np.float32) / 255 - 0.1307) / 0.3081
    np.testing.assert_allclose(test_given, expected, rtol=0, atol=2e-4)


def test_shifted_mnist_shifts_each_training_digit_by_up_to_2_pixels_and_nothing_else(mnist_dir):
    datamodule = datamodule_of("shifted_mnist", mnist_dir)
    raw_train, _ = raw_mnist(mnist_dir, train=True)
    train_at = check_split_of_the_training_file(datamodule, mnist_dir)
    _, train_given, _ = model_inputs(datamodule, datamodule.train_dataloader(), "train")
    shifts = []
    for given, at in zip(train_given, train_at, strict=True):
        pixels = raw_train[at].astype(np.float32) / 255
        found = [
            (dy, dx) for dy in range(-2, 3) for dx in range(-2, 3) if np.array_equal(given, shifted(pixels, dy, dx))
        ]
        assert found, f"training image {at} is no shift of its digit by 2 pixels or fewer"
        shifts.append(found[0])
    assert len(set(shifts)) >= 20  # 25 shifts possible, over 240 images
    # Validation and test digits as they are in the files.
    _, val_given, _ = model_inputs(datamodule, datamodule.val_dataloader(), "validate")
    val_stored, _, _ = model_inputs(datamodule, datamodule.val_dataloader(), "validate")
    assert np.array_equal(val_given, val_stored.astype(np.float32) / 255)
    raw_test, _ = raw_mnist(mnist_dir, train=False)
    _, test_given, _ = model_inputs(datamodule, datamodule.test_dataloader(), "test")
    assert np.array_equal(test_given, raw_test.astype(np.float32) / 255)


def test_rotated_mnist_tests_the_test_file_at_each_angle_counter_clockwise(mnist_dir):
    datamodule = datamodule_of("rotated_mnist", mnist_dir)
    angles = [0, 15, 30, 45, 60, 75, 90]  # conf/data/rotated_mnist.yaml
    assert datamodule.test_set_names == [f"rot{angle}" for angle in angles]
    raw_test, raw_labels = raw_mnist(mnist_dir, train=False)
    pixels = torch.from_numpy(raw_test.astype(np.float32) / 255)[:, None]
    loaders = datamodule.test_dataloader()
    assert len(loaders) == len(angles)
    for index, (angle, loader) in enumerate(zip(angles, loaders, strict=True)):
        _, given, labels = model_inputs(datamodule, loader, "test", dataloader_idx=index)
        expected = TF.rotate(pixels, angle, interpolation=InterpolationMode.BILINEAR)[:, 0].numpy()
        np.testing.assert_allclose(given, expected, rtol=0, atol=1e-5, err_msg=f"rot{angle}")
        assert np.array_equal(labels, raw_labels)
    # 90 degrees counter-clockwise is a rotation of the pixel grid: numpy's rot90 turns the same way.
    _, quarter, _ = model_inputs(datamodule, loaders[-1], "test", dataloader_idx=len(angles) - 1)
    np.testing.assert_allclose(quarter, np.rot90(raw_test.astype(np.float32) / 255, axes=(1, 2)), atol=1e-6)
    # Training and validation digits are not rotated.
    train_at = check_split_of_the_training_file(datamodule, mnist_dir)
    _, train_given, _ = model_inputs(datamodule, datamodule.train_dataloader(), "train")
    assert np.array_equal(train_given, raw_mnist(mnist_dir, train=True)[0][train_at].astype(np.float32) / 255)


def placement(canvas: np.ndarray, digit: np.ndarray) -> tuple[int, int]:
    """Where ``digit`` lies whole on an otherwise black ``canvas``: (top, left); fails if it does not."""
    size = digit.shape[0]
    assert canvas.sum() == pytest.approx(digit.sum(), rel=1e-6), "ink off the digit, or the digit cut"
    found = [
        (top, left)
        for top in range(canvas.shape[0] - size + 1)
        for left in range(canvas.shape[1] - size + 1)
        if np.array_equal(canvas[top : top + size, left : left + size], digit)
    ]
    assert found, "the digit is not on the canvas whole"
    return found[0]


def test_translated_mnist_puts_each_whole_digit_on_a_40_pixel_black_canvas(mnist_dir):
    datamodule = datamodule_of("translated_mnist", mnist_dir, extra_test_sets=[])
    raw_train, _ = raw_mnist(mnist_dir, train=True)
    raw_test, raw_labels = raw_mnist(mnist_dir, train=False)
    index = raw_index(raw_train)
    # Training digits: at a new random place at each step.
    train_stored, train_given, _ = model_inputs(datamodule, datamodule.train_dataloader(), "train")
    assert train_given.shape[1:] == (40, 40)
    places = set()
    for stored, given in zip(train_stored, train_given, strict=True):
        digit = raw_train[index[stored.tobytes()]].astype(np.float32) / 255
        places.add(placement(given, digit))
    assert len(places) > 50  # 13 x 13 places possible, over 240 digits
    # Test digits: the file's, in order, each at a place fixed by placement_seed: the same when built again.
    _, test_given, test_labels = model_inputs(datamodule, datamodule.test_dataloader(), "test")
    assert np.array_equal(test_labels, raw_labels)
    test_places = [
        placement(given, digit.astype(np.float32) / 255) for given, digit in zip(test_given, raw_test, strict=True)
    ]
    again = datamodule_of("translated_mnist", mnist_dir, extra_test_sets=[])
    _, test_again, _ = model_inputs(again, again.test_dataloader(), "test")
    assert np.array_equal(test_again, test_given) and len(set(test_places)) > 30


def placed_digit(canvas: np.ndarray, digits: dict[bytes, int], most: int) -> tuple[int, int, int]:
    """The digit of ``digits`` (bytes -> index) lying whole at (top, left) within ``most`` pixels of the
    canvas's corner, the rest of the canvas black: (index, top, left); fails if there is none."""
    size = 28
    for top in range(most + 1):
        for left in range(most + 1):
            window = canvas[top : top + size, left : left + size]
            as_bytes = np.rint(window * 255).astype(np.uint8).tobytes()
            if as_bytes in digits and np.isclose(canvas.sum(), window.sum(), rtol=1e-6):
                return digits[as_bytes], top, left
    raise AssertionError("no digit of the split lies whole on the canvas")


def test_multi_mnist_overlays_two_digits_of_different_classes_from_one_split(mnist_dir):
    datamodule = datamodule_of("multi_mnist", mnist_dir)
    raw_train, train_labels = raw_mnist(mnist_dir, train=True)
    raw_test, test_labels = raw_mnist(mnist_dir, train=False)
    trainer = datamodule.trainer
    splits = {}
    for stage, loader, raw, raw_labels in (
        ("train", datamodule.train_dataloader(), raw_train, train_labels),
        ("validate", datamodule.val_dataloader(), raw_train, train_labels),
        ("test", datamodule.test_dataloader(), raw_test, test_labels),
    ):
        trainer.training, trainer.testing = stage == "train", stage == "test"
        index = raw_index(raw)
        digits, shifts = [], set()
        for step, batch in enumerate(loader):
            trainer.global_step = step
            images, targets, components = datamodule.on_after_batch_transfer(batch, 0)
            assert images.shape[1:] == (1, 36, 36) and components.shape[1:] == (2, 1, 36, 36)
            for image, pair, target in zip(images.numpy(), components.numpy(), targets.numpy(), strict=True):
                # Each component one digit of the split, centred (4 pixels from the corner) and shifted by
                # up to 4 pixels each way (the paper's MultiMNIST, section 6.1), the image their clipped sum.
                found = [placed_digit(component[0], index, most=8) for component in pair]
                assert [raw_labels[at] for at, _, _ in found] == list(target)
                assert target[0] != target[1]
                np.testing.assert_allclose(image[0], np.clip(pair[:, 0].sum(0), 0, 1), atol=1e-6)
                digits.append([at for at, _, _ in found])
                shifts.update((top - 4, left - 4) for _, top, left in found)
        splits[stage] = np.array(digits)
        assert len(shifts) > 40, stage  # 81 shifts possible
    validation = set(splits["validate"][:, 0])
    assert len(validation) == datamodule.hparams.val_size  # each validation digit first once
    assert set(splits["validate"][:, 1]) <= validation  # partners from the validation digits
    assert not (set(splits["train"].flat) & validation)  # training pairs never use them
    assert sorted(splits["test"][:, 0]) == list(range(len(raw_test)))  # every test digit first, once


def read_norb(path: Path) -> np.ndarray:
    """A NORB matrix file as its format defines it: little-endian int32 magic (0x1E3D4C55 bytes,
    0x1E3D4C54 int32), the number of dimensions, max(3, that number) dimensions, then the values."""
    data = path.read_bytes() if path.suffix != ".gz" else gzip.decompress(path.read_bytes())
    magic, ndim = struct.unpack("<ii", data[:8])
    dtype = {0x1E3D4C55: np.uint8, 0x1E3D4C54: np.dtype("<i4")}[magic]
    shape = struct.unpack(f"<{ndim}i", data[8 : 8 + 4 * ndim])
    return np.frombuffer(data, dtype=dtype, offset=8 + 4 * max(3, ndim)).reshape(shape)


def raw_norb(data_dir: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(the stereo pairs downsampled 96 -> 48 by averaging 2x2 blocks, rounded to the nearest byte; the
    categories) of the official ``training`` or ``testing`` files, in file order."""
    (dat,) = (data_dir / "smallnorb").glob(f"*-{split}-dat.mat*")
    (cat,) = (data_dir / "smallnorb").glob(f"*-{split}-cat.mat*")
    pairs = read_norb(dat).astype(np.float64)
    blocks = pairs.reshape(*pairs.shape[:2], 48, 2, 48, 2).mean(axis=(3, 5))
    return np.rint(blocks).astype(np.uint8), read_norb(cat)


def per_image_standardisation(images: np.ndarray) -> np.ndarray:
    """tf.image.per_image_standardization: (x - mean) / max(std, 1 / sqrt(pixels)) over each image."""
    flat = images.reshape(len(images), -1)
    std = np.maximum(flat.std(axis=1), 1 / np.sqrt(flat.shape[1]))
    return ((flat - flat.mean(axis=1, keepdims=True)) / std[:, None]).reshape(images.shape)


@pytest.mark.parametrize("stereo", ["both", "left", "split"])
def test_smallnorb_gives_the_files_downsampled_pairs_cropped_and_standardised(norb_dir, stereo):
    datamodule = datamodule_of("smallnorb", norb_dir, stereo=stereo, val_size=12, batch_size=24)
    views = {"both": [0, 1], "left": [0], "split": [0, 1]}[stereo]
    as_samples = {  # a pair (2, 48, 48) -> the samples it gives
        "both": lambda pair: [pair],
        "left": lambda pair: [pair[:1]],
        "split": lambda pair: [pair[:1], pair[1:]],  # the left view, then the right, each a sample
    }[stereo]
    # Test: every pair of the testing file in order, its category, the centre 32x32 of the 48x48 image.
    raw_test, test_categories = raw_norb(norb_dir, "testing")
    expected = np.stack([sample for pair in raw_test for sample in as_samples(pair)])
    expected_labels = np.repeat(test_categories, len(as_samples(raw_test[0])))
    stored, given, labels = model_inputs(datamodule, datamodule.test_dataloader(), "test")
    stored = stored[:, None] if stored.ndim == 3 else stored
    assert np.array_equal(stored, expected) and np.array_equal(labels, expected_labels)
    centre = expected[..., 8:40, 8:40].astype(np.float64) / 255
    given = given[:, None] if given.ndim == 3 else given
    np.testing.assert_allclose(given, per_image_standardisation(centre), atol=1e-4)
    # Training and validation: the training file's pairs, each with its category, every one once.
    raw_train, train_categories = raw_norb(norb_dir, "training")
    index = {pair[views].tobytes(): i for i, pair in enumerate(raw_train)}
    seen = []
    for loader, stage in ((datamodule.val_dataloader(), "validate"), (datamodule.train_dataloader(), "train")):
        stored, given, labels = model_inputs(datamodule, loader, stage)
        stored = stored[:, None] if stored.ndim == 3 else stored
        if stereo == "split":  # a sample is one view: find its pair by either
            left = {pair[0].tobytes(): i for i, pair in enumerate(raw_train)}
            right = {pair[1].tobytes(): i for i, pair in enumerate(raw_train)}
            at = [left.get(image[0].tobytes(), right.get(image[0].tobytes())) for image in stored]
        else:
            at = [index[image.tobytes()] for image in stored]
        assert np.array_equal(labels, train_categories[at])
        seen += at
        if stage == "train":  # a random 32x32 crop, brightness and contrast jitter, then standardised
            assert given.shape[-2:] == (32, 32)
            flat = given.reshape(len(given), -1)
            np.testing.assert_allclose(flat.mean(axis=1), 0, atol=1e-5)
    assert sorted(seen) == sorted(list(range(len(raw_train))) * (2 if stereo == "split" else 1))


def test_every_fixed_evaluation_set_draws_from_a_stream_of_its_own():
    """Validation, test and affine-test sets of every seed: no two share their random draws (with two
    streams per seed, seed 0's affine test set drew what seed 1's validation set draws). Seed 0's
    streams are the ones its published results used: 0, 1, 2."""
    streams = {
        (seed, split): evaluation_generator(seed, split).initial_seed() for seed in range(5) for split in range(3)
    }
    assert len(set(streams.values())) == len(streams)
    assert [streams[0, split] for split in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match=r"^evaluation_generator: split=3: must be 0 to 2$"):
        evaluation_generator(0, 3)
