"""The colour benchmarks capsule papers report, 32x32 RGB: CIFAR-10 and SVHN, from their official files.

Each DataModule finds the official files in ``<data_dir>/<folder>/`` (torchvision's layout), downloads
what is missing where a network exists (``data.download``), checks every file against its published md5
(``data.verify_checksums``; false for your own files in the official format), reads them once into
uint8 tensors, holds out a seeded validation split of the training set, and on the device augments the
training images as the capsule papers do (zero padding then a random crop, and for CIFAR-10 a random
horizontal flip; or the dynamic-routing paper's random 24x24 crops, centred for evaluation) and
standardises each channel with the training set's mean and std.
"""

from __future__ import annotations

import dataclasses
import pickle
import tarfile
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import NonNegativeInt, PositiveInt
from torchvision.datasets import CIFAR10, SVHN

from capsexp.config.arguments import checked
from capsexp.data.augment import center_crop, random_crop, random_horizontal_flip
from capsexp.data.base import (
    DownloadFailed,
    InMemoryDataModule,
    OfficialFileOptions,
    data_folder_errors,
    download,
    md5sum,
    takes_options,
)
from capsexp.data.tensor_dataset import ImageTensorDataset
from capsexp.data.transforms import EvaluationTransform
from capsexp.errors import CorruptDatasetError

IMAGE_SIZE = 32  # both datasets' images are 32x32 RGB


@takes_options(OfficialFileOptions)
class ColourDataModule(InMemoryDataModule):
    """What CIFAR-10 and SVHN share; subclasses name their files (with md5s), how to fetch and read
    them, their channel statistics and whether mirroring keeps an image's class. Its options beside
    ``crop_size``, ``padding`` and ``normalize`` are :class:`~capsexp.data.base.OfficialFileOptions`."""

    num_classes = 10
    checksums: ClassVar[dict[str, str]]  # official file -> md5
    mean: tuple[float, float, float]  # per channel, pixels in [0, 1], of the training set
    std: tuple[float, float, float]
    flip: bool  # mirrored images keep their class (not so for digits)

    def __init__(
        self,
        crop_size: PositiveInt = IMAGE_SIZE,
        padding: NonNegativeInt = 4,
        normalize: bool = True,
        **options: Any,
    ) -> None:
        if crop_size > IMAGE_SIZE + 2 * padding:
            raise ValueError(
                f"crop_size={crop_size} is larger than the {IMAGE_SIZE}x{IMAGE_SIZE} images padded by {padding}"
            )
        super().__init__()
        self.save_arguments(locals())

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(self.checksums)

    @property
    def dims(self) -> tuple[int, int, int]:
        return (3, self.hparams.crop_size, self.hparams.crop_size)

    @property
    def evaluation_size(self) -> int:
        """The stored images' side: a centre crop to ``crop_size`` follows."""
        return IMAGE_SIZE

    # ---- files -------------------------------------------------------------------------------
    @data_folder_errors
    def prepare_data(self) -> None:
        """Download missing files (where allowed), then check every file's md5."""
        missing = [name for name in self.files if not (self.data_folder / name).exists()]
        if missing:
            if not self.hparams.download:
                raise self.not_found(missing, f"Downloading is off (data.download=false). {self.by_hand(missing)}")
            self.data_folder.mkdir(parents=True, exist_ok=True)
            try:
                self.fetch(missing)
            except DownloadFailed as error:
                raise self.not_found(missing, f"Download failed (offline?): {error}\n{self.by_hand(missing)}") from None
        if self.hparams.verify_checksums:
            for name, expected in self.checksums.items():
                if md5sum(self.data_folder / name) != expected:
                    raise CorruptDatasetError(
                        f"{self.data_folder / name}: md5 differs from the official {self.dataset_name} file. Delete "
                        "it and download it again; for your own files in the official format, pass "
                        "data.verify_checksums=false."
                    )

    def fetch(self, missing: list[str]) -> None:
        """Download the missing official files into the data folder (:class:`DownloadFailed` if it cannot)."""
        raise NotImplementedError

    def by_hand(self, missing: list[str]) -> str:
        """What to fetch by hand, and where to put it, where capsexp cannot download it."""
        raise NotImplementedError

    def read(self, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The official training or test images (N, 3, 32, 32) uint8 and labels (N,)."""
        raise NotImplementedError

    @data_folder_errors
    def setup(self, stage: str | None = None) -> None:
        self.split_batch_over_processes()
        if self.data_train is not None:
            return
        full = ImageTensorDataset(*self.read(train=True))
        validation, training = self.split_off_validation(torch.arange(len(full)))
        self.data_val, self.data_train = full.subset(validation), full.subset(training)
        self.data_test = ImageTensorDataset(*self.read(train=False))

    # ---- on the device -----------------------------------------------------------------------
    def pixel_batch(self, batch: tuple[torch.Tensor, torch.Tensor], dataloader_idx: int) -> tuple:
        """uint8 -> [0, 1]; in training, zero padding and a random crop (and a random mirror where it keeps
        the class), otherwise the centre crop."""
        images, targets = batch
        images = images.float().div_(255)
        size, padding = self.hparams.crop_size, self.hparams.padding
        if self.trainer is not None and self.trainer.training:
            generator = self.augmentation_generator(images.device)
            images = random_crop(F.pad(images, (padding,) * 4), size, generator)
            if self.flip:
                images = random_horizontal_flip(images, generator)
        elif size != IMAGE_SIZE:
            images = center_crop(images, size)
        return images, targets

    @property
    def evaluation_transform(self) -> EvaluationTransform:
        """Each channel standardised with the training set's mean and std (where ``normalize``)."""
        transform = super().evaluation_transform
        if not self.hparams.normalize:
            return transform
        return dataclasses.replace(transform, mean=tuple(self.mean), std=tuple(self.std))


@checked
class CIFAR10DataModule(ColourDataModule):
    """CIFAR-10 (Krizhevsky 2009): 50,000 training and 10,000 test images of 10 classes, from the
    official python batches in ``<data_dir>/cifar-10-batches-py/`` (the archive's layout); 45,000/5,000
    train/validation by default. The arguments are :class:`ColourDataModule`'s."""

    dataset_name = "CIFAR-10"
    checksums: ClassVar[dict[str, str]] = {name: md5 for name, md5 in CIFAR10.train_list + CIFAR10.test_list} | {
        CIFAR10.meta["filename"]: CIFAR10.meta["md5"]
    }
    # The training set's channel means and standard deviations (as the public CIFAR-10 recipes give them).
    mean = (0.4914, 0.4822, 0.4465)
    std = (0.2470, 0.2435, 0.2616)
    flip = True

    @property
    def data_folder(self) -> Path:
        return self.data_dir / CIFAR10.base_folder

    @property
    def class_names(self) -> list[str]:
        with open(self.data_folder / CIFAR10.meta["filename"], "rb") as handle:
            return [name.decode() for name in pickle.load(handle, encoding="bytes")[b"label_names"]]

    def by_hand(self, missing: list[str]) -> str:
        """Where to fetch the files from where capsexp cannot."""
        return f"By hand: fetch {CIFAR10.url} (md5 {CIFAR10.tgz_md5}) and unpack it in {self.data_dir}."

    def fetch(self, missing: list[str]) -> None:
        archive = self.data_dir / CIFAR10.filename
        download(CIFAR10.url, archive, CIFAR10.tgz_md5)
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(self.data_dir, filter="data")
        archive.unlink()

    def read(self, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        names = [name for name, _ in (CIFAR10.train_list if train else CIFAR10.test_list)]
        images, labels = [], []
        for name in names:
            try:
                with open(self.data_folder / name, "rb") as handle:
                    batch = pickle.load(handle, encoding="bytes")
                images.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, IMAGE_SIZE, IMAGE_SIZE))
                labels += list(batch[b"labels"])
            except (pickle.UnpicklingError, EOFError, KeyError, ValueError) as error:
                raise CorruptDatasetError(
                    f"{self.data_folder / name}: not a CIFAR-10 python batch ({error!r})"
                ) from None
        return torch.from_numpy(np.concatenate(images)), torch.tensor(labels)


@checked
class SVHNDataModule(ColourDataModule):
    """SVHN (Netzer et al. 2011), cropped digits: 73,257 training and 26,032 test images, from the
    official ``train_32x32.mat`` and ``test_32x32.mat`` in ``<data_dir>/svhn/`` (read with scipy; label
    10 is the digit 0). No mirroring: a mirrored digit is another digit or none. The arguments are
    :class:`ColourDataModule`'s."""

    dataset_name = "SVHN"
    checksums: ClassVar[dict[str, str]] = {
        SVHN.split_list[split][1]: SVHN.split_list[split][2] for split in ("train", "test")
    }
    # The training set's channel means and standard deviations (as the public SVHN recipes give them).
    mean = (0.4377, 0.4438, 0.4728)
    std = (0.1980, 0.2010, 0.1970)
    flip = False

    @property
    def data_folder(self) -> Path:
        return self.data_dir / "svhn"

    def by_hand(self, missing: list[str]) -> str:
        """Where to fetch the files from where capsexp cannot."""
        urls = {filename: url for url, filename, _ in SVHN.split_list.values()}
        return f"By hand: fetch {', '.join(urls[name] for name in missing)} into {self.data_folder}."

    def fetch(self, missing: list[str]) -> None:
        urls = {filename: url for url, filename, _ in SVHN.split_list.values()}
        for name in missing:
            download(urls[name], self.data_folder / name, self.checksums[name])

    def read(self, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        from scipy.io import loadmat

        path = self.data_folder / SVHN.split_list["train" if train else "test"][1]
        try:
            mat = loadmat(path)
            images = torch.from_numpy(np.ascontiguousarray(mat["X"].transpose(3, 2, 0, 1), dtype=np.uint8))
            labels = torch.from_numpy(mat["y"].astype(np.int64).reshape(-1)) % 10  # 10 is the digit 0
        except (ValueError, KeyError, TypeError) as error:
            raise CorruptDatasetError(f"{path}: not an SVHN .mat file ({error!r})") from None
        return images, labels
