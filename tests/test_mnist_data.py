"""MNISTDataModule on small synthetic files in the real IDX format; the errors a user meets."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch

from capsexp.data import MNISTDataModule
from capsexp.data.mnist import md5sum
from capsexp.errors import CorruptDatasetError, DatasetNotFoundError
from tests.helpers import MNIST_FILES, FakeTrainer, write_mnist

RAW = Path("MNIST") / "raw"


def make_datamodule(data_dir: Path, **kwargs) -> MNISTDataModule:
    options = {"batch_size": 32, "val_size": 50, "verify_checksums": False, "download": False}
    return MNISTDataModule(data_dir=data_dir, **{**options, **kwargs})


def prepared(data_dir: Path, stage: str = "fit", **kwargs) -> MNISTDataModule:
    datamodule = make_datamodule(data_dir, **kwargs)
    datamodule.prepare_data()
    datamodule.setup(stage)
    return datamodule


def test_reads_gz_files_into_uint8_batches_then_unit_range_floats(mnist_dir):
    datamodule = prepared(mnist_dir)
    images, targets = next(iter(datamodule.train_dataloader()))
    assert images.shape == (32, 1, 28, 28) and images.dtype == torch.uint8
    assert targets.dtype == torch.long and int(targets.max()) <= 9
    images, _ = datamodule.on_after_batch_transfer((images, targets), 0)
    assert images.dtype == torch.float32 and images.min() >= 0.0 and images.max() <= 1.0
    # prepare_data unpacked the .gz files next to themselves, as torchvision expects.
    assert all((mnist_dir / RAW / name).exists() for name in MNIST_FILES)


def test_split_sizes_are_fixed_by_split_seed_not_by_the_run_seed(mnist_dir):
    first = prepared(mnist_dir)
    torch.manual_seed(123)
    second = prepared(mnist_dir)
    assert (len(first.data_train), len(first.data_val)) == (250, 50)
    assert torch.equal(first.data_val.images, second.data_val.images)
    other = prepared(mnist_dir, split_seed=1)
    assert not torch.equal(first.data_val.images, other.data_val.images)


def test_test_set_and_plain_unpacked_files(tmp_path):
    data_dir = write_mnist(tmp_path, train=120, test=40, gz=False)
    datamodule = prepared(data_dir, stage="test")
    assert len(datamodule.data_test) == 40
    assert sum(len(batch[1]) for batch in datamodule.test_dataloader()) == 40


def test_normalize_standardises_with_the_mnist_training_sets_mean_and_std(mnist_dir):
    batches = {}
    for normalize in (False, True):
        datamodule = prepared(mnist_dir, normalize=normalize)
        batches[normalize], _ = datamodule.on_after_batch_transfer(next(iter(datamodule.val_dataloader())), 0)
    # The MNIST training images' mean and std, 0.1307 and 0.3081 (of pixel values in [0, 1]).
    torch.testing.assert_close(batches[True], (batches[False] - 0.1307) / 0.3081)


def test_global_batch_is_split_over_processes(mnist_dir):
    datamodule = make_datamodule(mnist_dir, batch_size=64)
    datamodule.trainer = FakeTrainer(world_size=4)
    datamodule.prepare_data()
    datamodule.setup("fit")
    assert datamodule.train_dataloader().batch_size == 16
    datamodule = make_datamodule(mnist_dir, batch_size=30)
    datamodule.trainer = FakeTrainer(world_size=4)
    with pytest.raises(ValueError, match="not divisible"):
        datamodule.setup("fit")


def test_missing_files_without_download_name_folder_and_files(tmp_path):
    with pytest.raises(DatasetNotFoundError) as error:
        make_datamodule(tmp_path).prepare_data()
    message = str(error.value)
    assert str(tmp_path / RAW) in message
    assert all(name in message for name in MNIST_FILES)
    assert "CAPSEXP_DATA_DIR" in message and "data.data_dir" in message


def test_failed_download_is_reported_and_leaves_nothing(tmp_path, monkeypatch):
    # A closed loopback port: the download fails at once, as offline.
    monkeypatch.setattr("torchvision.datasets.MNIST.mirrors", ["http://127.0.0.1:9/"])
    with pytest.raises(DatasetNotFoundError, match="Download failed"):
        make_datamodule(tmp_path, download=True).prepare_data()
    assert not any((tmp_path / RAW).glob("*ubyte*"))


def test_truncated_gz_names_the_file_and_leaves_no_partial_copy(mnist_dir):
    gz = mnist_dir / RAW / "train-images-idx3-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[:-500])
    with pytest.raises(CorruptDatasetError, match=r"train-images-idx3-ubyte.gz") as error:
        make_datamodule(mnist_dir).prepare_data()
    assert "truncated or corrupted" in str(error.value)
    assert not (mnist_dir / RAW / "train-images-idx3-ubyte").exists()
    assert not list((mnist_dir / RAW).glob("*.partial"))


def test_unpacked_file_with_truncated_payload_names_the_file(mnist_dir):
    gz = mnist_dir / RAW / "t10k-images-idx3-ubyte.gz"
    gz.write_bytes(gzip.compress(gzip.decompress(gz.read_bytes())[:-28]))
    with pytest.raises(CorruptDatasetError, match=r"t10k-images-idx3-ubyte.*header .* announces"):
        make_datamodule(mnist_dir).prepare_data()


def test_wrong_magic_names_the_file(mnist_dir):
    gz = mnist_dir / RAW / "train-labels-idx1-ubyte.gz"
    payload = bytearray(gzip.decompress(gz.read_bytes()))
    payload[3] = 0x03  # image magic on a label file
    gz.write_bytes(gzip.compress(bytes(payload)))
    with pytest.raises(CorruptDatasetError, match="train-labels-idx1-ubyte: not an MNIST label file"):
        make_datamodule(mnist_dir).prepare_data()


def test_labels_out_of_range_are_rejected(mnist_dir):
    gz = mnist_dir / RAW / "train-labels-idx1-ubyte.gz"
    payload = bytearray(gzip.decompress(gz.read_bytes()))
    payload[-1] = 12
    gz.write_bytes(gzip.compress(bytes(payload)))
    with pytest.raises(CorruptDatasetError, match="label 12 out of range"):
        make_datamodule(mnist_dir).prepare_data()


def test_checksum_mismatch_points_to_the_switch(mnist_dir):
    with pytest.raises(CorruptDatasetError, match=r"md5 differs.*verify_checksums=false"):
        make_datamodule(mnist_dir, verify_checksums=True).prepare_data()
    make_datamodule(mnist_dir, verify_checksums=False).prepare_data()


def test_real_mnist_checksums(real_mnist_dir):
    datamodule = prepared(real_mnist_dir, stage="test", verify_checksums=True)
    assert len(datamodule.data_test) == 10_000
    assert torch.bincount(datamodule.data_test.targets).tolist() == [
        980,
        1135,
        1032,
        1010,
        982,
        892,
        958,
        1028,
        974,
        1009,
    ]
    assert md5sum(real_mnist_dir / RAW / "t10k-images-idx3-ubyte") == "2646ac647ad5339dbf082846283269ea"


def test_real_mnist_is_found_plain_or_gz_as_the_datamodule_reads_it(tmp_path):
    """The real-data tests run for a user whose data dir holds the four IDX files unpacked, not only .gz."""
    from tests.helpers import has_real_mnist

    assert not has_real_mnist(tmp_path)
    write_mnist(tmp_path, gz=False)
    assert has_real_mnist(tmp_path)
    (tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    assert not has_real_mnist(tmp_path)
