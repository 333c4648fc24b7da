"""CIFAR-10, SVHN and Fashion-MNIST from their official file formats (written small by the tests): read, checked
against the published md5s, refused cleanly offline, augmented as the capsule papers did, trained on."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.io import savemat

from capsexp.data import CIFAR10DataModule, FashionMNISTDataModule, SVHNDataModule
from capsexp.errors import CorruptDatasetError, DatasetNotFoundError
from tests.helpers import TINY_RUN, two_step_run, write_mnist

CIFAR_NAMES = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]


def write_cifar(data_dir: Path, per_batch: int = 12, seed: int = 0) -> Path:
    """The official python batches (pickled dicts of a (N, 3072) uint8 array and a label list)."""
    rng = np.random.default_rng(seed)
    folder = data_dir / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        labels = [int(v) for v in rng.integers(0, 10, per_batch)]
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        with open(folder / name, "wb") as handle:
            pickle.dump({b"batch_label": name.encode(), b"labels": labels, b"data": data}, handle)
    with open(folder / "batches.meta", "wb") as handle:
        pickle.dump({b"label_names": CIFAR_NAMES, b"num_cases_per_batch": per_batch}, handle)
    return data_dir


def write_svhn(data_dir: Path, count: int = 40, seed: int = 0) -> Path:
    """The official .mat files: X (32, 32, 3, N) uint8 and y (N, 1) in 1-10, 10 for the digit 0."""
    rng = np.random.default_rng(seed)
    (data_dir / "svhn").mkdir(parents=True)
    for name in ("train_32x32.mat", "test_32x32.mat"):
        savemat(
            data_dir / "svhn" / name,
            {"X": rng.integers(0, 256, (32, 32, 3, count), dtype=np.uint8), "y": rng.integers(1, 11, (count, 1))},
        )
    return data_dir


def test_cifar10_batches_are_read_as_the_official_files_lay_them_out(tmp_path):
    datamodule = CIFAR10DataModule(data_dir=write_cifar(tmp_path), val_size=10, verify_checksums=False)
    datamodule.prepare_data()
    datamodule.setup("fit")
    assert (len(datamodule.data_train), len(datamodule.data_val), len(datamodule.data_test)) == (50, 10, 12)
    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "rb") as handle:
        batch = pickle.load(handle)
    # Row-major 3072 bytes: the red plane, then green, then blue, each 32x32.
    assert torch.equal(datamodule.data_test.images[3, 1, 5], torch.from_numpy(batch[b"data"][3, 1024 + 5 * 32 :][:32]))
    assert datamodule.data_test.targets.tolist() == batch[b"labels"]
    assert datamodule.class_names[:2] == ["airplane", "automobile"] and datamodule.dims == (3, 32, 32)


def test_svhn_mat_files_are_read_with_10_as_the_digit_0(tmp_path):
    datamodule = SVHNDataModule(data_dir=write_svhn(tmp_path), val_size=8, verify_checksums=False)
    datamodule.prepare_data()
    datamodule.setup("fit")
    from scipy.io import loadmat

    mat = loadmat(tmp_path / "svhn" / "test_32x32.mat")
    assert torch.equal(datamodule.data_test.images[7, 2], torch.from_numpy(mat["X"][:, :, 2, 7]))
    assert datamodule.data_test.targets.tolist() == [int(y) % 10 for y in mat["y"][:, 0]]
    assert 0 in datamodule.data_test.targets.tolist() and 10 not in datamodule.data_test.targets.tolist()


@pytest.mark.parametrize(
    ("module", "write", "culprit", "by_hand"),
    [
        (
            CIFAR10DataModule,
            write_cifar,
            "data_batch_1",
            "By hand: fetch https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        ),
        (
            SVHNDataModule,
            write_svhn,
            "test_32x32.mat",
            "By hand: fetch http://ufldl.stanford.edu/housenumbers/test_32x32.mat",
        ),
    ],
)
def test_files_that_are_not_the_official_ones_and_missing_files_offline_are_short_errors(
    module, write, culprit, by_hand, tmp_path
):
    data_dir = write(tmp_path / "data")
    with pytest.raises(CorruptDatasetError, match=r"md5 differs from the official .* data\.verify_checksums=false"):
        module(data_dir=data_dir).prepare_data()  # the tests' files are not the official ones
    next(p for p in data_dir.rglob(culprit)).unlink()
    with pytest.raises(DatasetNotFoundError, match=rf"(?s){culprit}\n.*Downloading is off") as refused:
        module(data_dir=data_dir, download=False).prepare_data()
    assert by_hand in str(refused.value)  # the archive to fetch where capsexp cannot


def test_training_batches_are_padded_cropped_and_mirrored_and_evaluation_is_centred(tmp_path):
    datamodule = CIFAR10DataModule(data_dir=write_cifar(tmp_path), val_size=10, verify_checksums=False, normalize=False)

    class Trainer:  # what pixel_batch reads of a trainer
        training, global_step, global_rank = True, 3, 0

    datamodule.trainer = Trainer()
    images = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)
    trained, _ = datamodule.pixel_batch((images, torch.zeros(64)), 0)
    assert trained.shape == (64, 3, 32, 32) and not torch.equal(trained, images.float() / 255)
    assert (trained == 0).any()  # the zero padding showed in some crops
    # Without padding only the mirror is left: each image as it was or mirrored, both seen.
    unpadded = CIFAR10DataModule(data_dir=tmp_path, padding=0, verify_checksums=False)
    unpadded.trainer = Trainer()
    mirrored, _ = unpadded.pixel_batch((images, torch.zeros(64)), 0)
    pixels = images.float() / 255
    same = (mirrored == pixels).flatten(1).all(1)
    flipped = (mirrored == pixels.flip(-1)).flatten(1).all(1)
    assert (same | flipped).all() and same.any() and flipped.any()
    Trainer.training = False
    evaluated, _ = datamodule.pixel_batch((images, torch.zeros(64)), 0)
    assert torch.equal(evaluated, images.float() / 255)
    dr = CIFAR10DataModule(data_dir=tmp_path, crop_size=24, padding=0, verify_checksums=False)
    dr.trainer = Trainer()
    assert dr.pixel_batch((images, torch.zeros(64)), 0)[0].shape == (64, 3, 24, 24) and dr.dims == (3, 24, 24)
    standardized = CIFAR10DataModule(data_dir=tmp_path, verify_checksums=False).input_transform(
        torch.full((1, 3, 2, 2), 0.4914)
    )
    assert standardized[0, 0].abs().max() < 1e-6  # the red channel's mean maps to 0


def write_fashion(data_dir: Path) -> Path:
    return write_mnist(data_dir, train=120, test=40, folder="FashionMNIST")


@pytest.mark.parametrize(
    ("data", "write", "model"),
    [
        ("cifar10", write_cifar, "lenet5"),
        pytest.param("svhn", write_svhn, "capsnet_small", marks=pytest.mark.slow),  # 6 s: make test-slow
        ("fashion_mnist", write_fashion, "lenet5"),
    ],
)
def test_each_colour_dataset_trains_from_the_command_line(data, write, model, tmp_path):
    logged = two_step_run(
        tmp_path / "run",
        *(o for o in TINY_RUN if o != "data.val_size=60"),
        f"data={data}",
        f"paths.data_dir={write(tmp_path / 'data')}",
        "data.val_size=10",
        "data.batch_size=10",
        *(["data.verify_checksums=false"] if data == "fashion_mnist" else []),
        f"model={model}",
        *(["model.net.backbone=resnet"] if model == "capsnet_small" else []),  # the colour backbone
    )
    assert "test/acc" in logged


def test_fashion_mnist_is_read_from_its_idx_files_and_checked_against_its_gz_md5s(tmp_path):
    data_dir = write_mnist(tmp_path / "data", train=120, test=40, folder="FashionMNIST")
    datamodule = FashionMNISTDataModule(data_dir=data_dir, val_size=20, verify_checksums=False)
    datamodule.prepare_data()
    datamodule.setup()
    assert (len(datamodule.data_train), len(datamodule.data_val), len(datamodule.data_test)) == (100, 20, 40)
    raw = data_dir / "FashionMNIST" / "raw"
    with pytest.raises(
        CorruptDatasetError, match=r"train-images-idx3-ubyte\.gz: md5 differs from the official Fashion-MNIST"
    ):
        FashionMNISTDataModule(data_dir=data_dir).prepare_data()
    (raw / "train-images-idx3-ubyte.gz").unlink()  # unpacked only: no published md5 to check it against
    with pytest.raises(CorruptDatasetError, match=r"published for its \.gz files only"):
        FashionMNISTDataModule(data_dir=data_dir).prepare_data()
    (raw / "train-images-idx3-ubyte").unlink()
    with pytest.raises(
        DatasetNotFoundError, match=r"(?s)Fashion-MNIST not found in .*FashionMNIST/raw.*Downloading is off"
    ):
        FashionMNISTDataModule(data_dir=data_dir, download=False).prepare_data()
