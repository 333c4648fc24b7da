"""MNIST as a LightningDataModule, on ``torchvision.datasets.MNIST``.

The four official IDX files live in ``<data_dir>/MNIST/raw/`` (torchvision's layout), plain or
``.gz``. ``prepare_data`` (one process per node) downloads only what is missing, unpacks, and checks
every file: IDX header, size, label range and, by default, the official md5. Each failure stops the run
with a short message naming the file. ``setup`` then reads the checked files into memory.
"""

from __future__ import annotations

import dataclasses
import gzip
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal
from urllib.error import URLError

import torch
from annotated_types import Ge, Le, MinLen
from pydantic import NonNegativeInt
from torch.utils.data import DataLoader
from torchvision.datasets import MNIST, FashionMNIST
from torchvision.datasets.utils import download_and_extract_archive

from capsexp.config.arguments import checked
from capsexp.data.affnist import AFFNIST_SIZE, TEST_BATCHES, ensure_affnist_files, read_affnist_test
from capsexp.data.augment import random_affine, random_placement, random_shift, rotate
from capsexp.data.base import (
    AFFINE_SPLIT,
    InMemoryDataModule,
    OfficialFileOptions,
    data_folder_errors,
    evaluation_generator,
    md5sum,
    partial_path,
    takes_options,
)
from capsexp.data.conventions import ImageConventions
from capsexp.data.tensor_dataset import ImageTensorDataset
from capsexp.data.transforms import EvaluationTransform
from capsexp.errors import CorruptDatasetError
from capsexp.records.metric_names import PLAIN, rotation_set_name

IMAGES_MAGIC = 0x00000803  # IDX: unsigned bytes, 3 dimensions
LABELS_MAGIC = 0x00000801  # IDX: unsigned bytes, 1 dimension

# md5 of the official files once unpacked; those of the .gz files come from torchvision.
UNPACKED_MD5 = {
    "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
}
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
DIGIT_SIZE = 28  # MNIST digits are 28x28
MNIST_DIGIT_BOX = 20  # the box each digit's ink was scaled into (LeCun et al. 1998)


def write_idx(path: Path, array) -> Path:
    """Write a uint8 array (N, H, W) or (N,) as an IDX file, the official MNIST format (a big-endian
    header: the magic number, then each dimension; then the raw bytes), gzipped where ``path`` ends in
    ``.gz``: MNIST's own files for a test or a routing package's own."""
    import numpy as np

    array = np.asarray(array, dtype=np.uint8)
    payload = struct.pack(f">{1 + array.ndim}i", 0x0800 | array.ndim, *array.shape) + array.tobytes()
    path.write_bytes(gzip.compress(payload) if path.suffix == ".gz" else payload)
    return path


def check_idx_file(path: Path, magic: int, max_label: int = 9) -> int:
    """Validate an unpacked IDX file: magic number, header and exact size; labels in range.

    Returns the number of items. Raises :class:`CorruptDatasetError` naming the file otherwise.
    """
    ndim = magic & 0xFF
    header_size = 4 + 4 * ndim
    size = path.stat().st_size
    with open(path, "rb") as handle:
        header = handle.read(header_size)
        if len(header) < header_size:
            raise CorruptDatasetError(f"{path}: truncated IDX header ({size} bytes)")
        found_magic, *dims = struct.unpack(f">{1 + ndim}i", header)
        if found_magic != magic:
            raise CorruptDatasetError(
                f"{path}: not an MNIST {'image' if ndim == 3 else 'label'} file "
                f"(IDX magic {found_magic:#010x}, expected {magic:#010x})"
            )
        expected = header_size + int(torch.tensor(dims).prod())
        if size != expected:
            raise CorruptDatasetError(
                f"{path}: {size} bytes, but its header (dims {dims}) announces {expected}: "
                "the file is truncated or corrupted"
            )
        if ndim == 1:
            labels = torch.frombuffer(bytearray(handle.read()), dtype=torch.uint8)
            if len(labels) and int(labels.max()) > max_label:
                raise CorruptDatasetError(f"{path}: label {int(labels.max())} out of range 0-{max_label}")
    return dims[0]


def _unpack(gz_path: Path, path: Path) -> None:
    """gunzip to a temporary name, then rename, so that an interrupted unpack leaves nothing behind."""
    partial = partial_path(path)
    try:
        with gzip.open(gz_path, "rb") as source, open(partial, "wb") as target:
            while chunk := source.read(1 << 20):
                target.write(chunk)
    except (OSError, EOFError, zlib.error) as error:
        partial.unlink(missing_ok=True)
        if isinstance(error, PermissionError):
            raise CorruptDatasetError(
                f"cannot unpack {gz_path}: {path.parent} is not writable. "
                "Unpack the files with `gunzip -k` or copy the folder somewhere writable."
            ) from None
        raise CorruptDatasetError(
            f"{gz_path}: not a valid gzip file ({error}); it is truncated or corrupted. "
            "Delete it and download it again."
        ) from None
    partial.replace(path)


class MNISTFiles(InMemoryDataModule):
    """The official MNIST files of a DataModule built on MNIST: found, downloaded where allowed,
    unpacked and checked (hyperparameters ``download`` and ``verify_checksums``), then read. A dataset
    in MNIST's four IDX files (Fashion-MNIST) names its torchvision class, which holds its mirrors and
    the md5s of its ``.gz`` files, and the md5s of the files unpacked where they are published."""

    dataset_name = "MNIST"
    num_classes = 10
    files = tuple(UNPACKED_MD5)
    torchvision_dataset: ClassVar[type[MNIST]] = MNIST
    unpacked_md5: ClassVar[dict[str, str] | None] = UNPACKED_MD5
    mean, std = MNIST_MEAN, MNIST_STD  # of the training images' pixels in [0, 1] (data.normalize)

    @property
    def data_folder(self) -> Path:
        return self.data_dir / self.torchvision_dataset.__name__ / "raw"

    # ---- files -------------------------------------------------------------------------------
    @data_folder_errors
    def prepare_data(self) -> None:
        """Download missing files (if allowed), unpack ``.gz`` files and validate all four."""
        missing = [name for name in self.files if not self.source_of(name)]
        if missing:
            self._download(missing)
        for name in self.files:
            self._check(name)

    def _download(self, missing: list[str]) -> None:
        if not self.hparams.download:
            raise self.not_found(missing, "Downloading is off (data.download=false).")
        self.data_folder.mkdir(parents=True, exist_ok=True)
        for name in missing:
            errors = []
            for mirror in self.torchvision_dataset.mirrors:
                try:
                    download_and_extract_archive(
                        f"{mirror}{name}.gz", download_root=str(self.data_folder), md5=self._gz_md5(name)
                    )
                    break
                except (URLError, RuntimeError, OSError) as error:
                    errors.append(f"{mirror}: {getattr(error, 'reason', error)}")
                    # torchvision writes in place: never leave a partial download looking complete.
                    (self.data_folder / f"{name}.gz").unlink(missing_ok=True)
                    (self.data_folder / name).unlink(missing_ok=True)
            else:
                raise self.not_found(missing, "Download failed (offline?):\n  " + "\n  ".join(errors))

    def _gz_md5(self, name: str) -> str:
        return dict(self.torchvision_dataset.resources)[f"{name}.gz"]

    def _check(self, name: str) -> None:
        path, gz_path = self.data_folder / name, self.data_folder / f"{name}.gz"
        unpacked_here = not path.exists()
        if unpacked_here:
            _unpack(gz_path, path)
        try:
            check_idx_file(path, IMAGES_MAGIC if "images" in name else LABELS_MAGIC)
            if self.hparams.verify_checksums:
                self._check_md5(name, gz_path if unpacked_here else path)
        except CorruptDatasetError:
            if unpacked_here:  # do not leave a bad unpacked copy that later runs would trust
                path.unlink(missing_ok=True)
            raise

    def _check_md5(self, name: str, shown: Path) -> None:
        """The unpacked file against its official md5 or, where only the ``.gz`` files' are published,
        the ``.gz`` file against its own (``shown`` is the file the message names)."""
        path, gz_path = self.data_folder / name, self.data_folder / f"{name}.gz"
        if self.unpacked_md5 is not None:
            matches = md5sum(path) == self.unpacked_md5[name]
        elif gz_path.exists():
            matches, shown = md5sum(gz_path) == self._gz_md5(name), gz_path
        else:
            raise CorruptDatasetError(
                f"{path}: {self.dataset_name}'s md5s are published for its .gz files only, and {gz_path.name} is "
                "not there to check. Put the .gz file beside it, or pass data.verify_checksums=false."
            )
        if not matches:
            raise CorruptDatasetError(
                f"{shown}: md5 differs from the official {self.dataset_name} file. "
                "Delete it and download it again; for your own data in the IDX format, "
                "pass data.verify_checksums=false."
            )

    def _load(self, train: bool) -> ImageTensorDataset:
        dataset = self.torchvision_dataset(str(self.data_dir), train=train, download=False)
        return ImageTensorDataset(dataset.data.unsqueeze(1), dataset.targets)


@checked
@takes_options(OfficialFileOptions)
class MNISTDataModule(MNISTFiles):
    """MNIST digits, pixels in [0, 1], with a fixed-seed train/validation split; the files in
    ``<data_dir>/MNIST/raw/`` (torchvision's layout).

    Args:
        normalize: standardise with the MNIST mean and std (off by default: reconstructions are
            compared with pixels in [0, 1]).
        train_shift: shift each training image by a random whole number of pixels in
            [-train_shift, train_shift] along each axis, zero padded (the CapsNet paper's only
            augmentation: 2). Validation and test images are never shifted.
        test_rotations: test on the test set rotated by each of these angles (degrees, counter-
            clockwise, bilinear); each is its own test DataLoader, logged as ``test/acc_rot<angle>``.
            ``None``: one unrotated test set, logged as ``test/acc``.
        canvas: place every digit at a random position on a ``canvas`` x ``canvas`` black background
            (Sabour et al. 2017, section 5.2: 40, the size of affNIST): training digits at a new
            position at every step, validation and test digits at positions fixed by
            ``placement_seed``. ``None``: the 28x28 digits as they are.
        placement_seed: seed of the validation and test placements (and of the affine maps of the
            ``affine_mnist`` test set), independent of the run's seed.
        extra_test_sets: test sets beside the plain one, on the canvas, each its own test DataLoader
            logged as ``test/acc_<name>``: ``affine_mnist``, the MNIST test digits each under a random
            affine map of the affNIST ranges (:class:`~capsexp.data.augment.AffineRanges`), generated
            here; ``affnist``, the official affNIST test set (:mod:`capsexp.data.affnist`, canvas 40).
        affnist_batches: how many of the official affNIST test files (10,000 images each, all 32 by
            default) the ``affnist`` test set reads.
        Others: :class:`~capsexp.data.base.OfficialFileOptions`.
    """

    def __init__(
        self,
        normalize: bool = False,
        train_shift: NonNegativeInt = 0,
        test_rotations: Annotated[Sequence[float], MinLen(1)] | None = None,
        canvas: Annotated[int, Ge(DIGIT_SIZE)] | None = None,
        placement_seed: int = 0,
        extra_test_sets: Sequence[Literal["affine_mnist", "affnist"]] = (),
        affnist_batches: Annotated[int, Ge(1), Le(TEST_BATCHES)] = TEST_BATCHES,
        **options: Any,
    ) -> None:
        if canvas is not None and train_shift:
            raise ValueError(
                f"train_shift={train_shift} with canvas={canvas}: choose one (on a canvas, training digits "
                "are placed anywhere already)"
            )
        if extra_test_sets and canvas is None:
            raise ValueError(
                f"extra_test_sets={list(extra_test_sets)} needs a canvas (data.canvas, e.g. data=translated_mnist): "
                "their digits are placed on it"
            )
        if "affnist" in extra_test_sets and canvas != AFFNIST_SIZE:
            raise ValueError(f"the affnist test set's images are {AFFNIST_SIZE}x{AFFNIST_SIZE}; canvas={canvas}")
        if test_rotations is not None and extra_test_sets:
            raise ValueError("test_rotations and extra_test_sets: choose one")
        super().__init__()
        self.save_arguments(locals())

    @property
    def dims(self) -> tuple[int, int, int]:
        """(channels, height, width) of the images."""
        size = self.hparams.canvas or DIGIT_SIZE
        return (1, size, size)

    @property
    def test_set_names(self) -> list[str]:
        """One name per test DataLoader (:mod:`capsexp.records.metric_names`): the plain set, or one per angle."""
        if self.hparams.test_rotations is None:
            return [PLAIN, *self.hparams.extra_test_sets]
        return [rotation_set_name(angle) for angle in self.hparams.test_rotations]

    # ---- files and datasets ------------------------------------------------------------------
    @data_folder_errors
    def prepare_data(self) -> None:
        """MNIST's files, and the affNIST test files when asked for (before training, not at test time)."""
        super().prepare_data()
        if "affnist" in self.hparams.extra_test_sets:
            ensure_affnist_files(self.data_dir, self.hparams.affnist_batches, self.hparams.download)

    @data_folder_errors
    def setup(self, stage: str | None = None) -> None:
        self.split_batch_over_processes()

        if stage in ("fit", "validate", None) and self.data_train is None:
            full = self._load(train=True)
            validation, training = self.split_off_validation(torch.arange(len(full)))
            self.data_val, self.data_train = self._placed(full.subset(validation), 0), full.subset(training)
        if stage in ("test", None) and self.data_test is None:
            test = self._load(train=False)
            self.data_test = self._placed(test, 1)
            self.extra_tests = tuple(self._extra_test_set(name, test) for name in self.hparams.extra_test_sets)

    def _extra_test_set(self, name: str, test: ImageTensorDataset) -> ImageTensorDataset:
        if name == "affine_mnist":
            generator = evaluation_generator(self.hparams.placement_seed, AFFINE_SPLIT)
            return ImageTensorDataset(random_affine(test.images, self.hparams.canvas, generator), test.targets)
        images, labels = read_affnist_test(self.data_dir, self.hparams.affnist_batches)
        return ImageTensorDataset(images, labels)

    def _placed(self, dataset: ImageTensorDataset, split: int) -> ImageTensorDataset:
        """An evaluation set on the canvas (if any), each digit at a position fixed by the placement seed."""
        if self.hparams.canvas is None:
            return dataset
        placed = random_placement(
            dataset.images, self.hparams.canvas, evaluation_generator(self.hparams.placement_seed, split)
        )
        return ImageTensorDataset(placed, dataset.targets)

    def test_dataloader(self) -> DataLoader | list[DataLoader]:
        if self.hparams.test_rotations is None:
            return super().test_dataloader()
        # The same images for every angle; each loader's batches are rotated on the device.
        return [self._loader(self.data_test, shuffle=False) for _ in self.hparams.test_rotations]

    # ---- on the device -----------------------------------------------------------------------
    def pixel_batch(self, batch: tuple[torch.Tensor, torch.Tensor], dataloader_idx: int) -> tuple:
        """uint8 -> float in [0, 1], then shift or place on the canvas (training) or rotate (testing), all
        on the device."""
        images, targets = batch
        images = images.float().div_(255)
        trainer = self.trainer
        if trainer is not None and trainer.training:
            if self.hparams.train_shift:
                images = random_shift(images, self.hparams.train_shift, self.augmentation_generator(images.device))
            elif self.hparams.canvas is not None:
                images = random_placement(images, self.hparams.canvas, self.augmentation_generator(images.device))
        if self.hparams.test_rotations is not None and trainer is not None and trainer.testing:
            angle = self.hparams.test_rotations[dataloader_idx]
            if angle:
                images = rotate(images, angle)
        return images, targets

    @property
    def evaluation_transform(self) -> EvaluationTransform:
        """Standardised with the training set's mean and std where ``normalize`` asks; the pixels otherwise."""
        transform = super().evaluation_transform
        if not self.hparams.normalize:
            return transform
        return dataclasses.replace(transform, mean=(self.mean,), std=(self.std,))

    @property
    def image_conventions(self) -> ImageConventions:
        """White ink on black, digits framed as MNIST's (20x20 box in 28x28); on a canvas, that digit at
        its centre (the evaluation digits sit at random positions on it, every one equally likely)."""
        return digit_conventions(self.evaluation_size)


def digit_conventions(size: int) -> ImageConventions:
    """MNIST's digits (LeCun et al. 1998): light ink on dark, each framed in a 20x20 box, centred by its
    mass in 28x28; on a ``size`` x ``size`` canvas where ``size`` is larger."""
    return ImageConventions(size=size, light_ink=True, digit_box=MNIST_DIGIT_BOX, digit=DIGIT_SIZE)


@checked
class FashionMNISTDataModule(MNISTDataModule):
    """Fashion-MNIST (Xiao, Rasul & Vollgraf 2017): 28x28 grey images of 10 kinds of clothing in MNIST's
    four IDX files, in ``<data_dir>/FashionMNIST/raw/`` (torchvision's layout), with every option of
    :class:`MNISTDataModule`. Only the ``.gz`` files' md5s are published (zalandoresearch/fashion-mnist),
    so those files are what ``verify_checksums`` checks."""

    dataset_name = "Fashion-MNIST"
    torchvision_dataset = FashionMNIST
    unpacked_md5 = None
    mean, std = 0.2860, 0.3530  # of the training images (as the public Fashion-MNIST recipes give them)

    @property
    def class_names(self) -> list[str]:
        return list(FashionMNIST.classes)

    @property
    def image_conventions(self) -> ImageConventions:
        """Light garments on black, as MNIST's digits, but not framed as digits: resized and cropped."""
        return ImageConventions(size=self.evaluation_size, light_ink=True)
