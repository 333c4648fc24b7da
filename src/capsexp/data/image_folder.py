"""Your own images: a folder in torchvision's ``ImageFolder`` layout, one sub-folder per class.

Either ``<root>/<class>/<image>``, split into training, validation and test by seeded fractions, or
``<root>/train/<class>/...``, ``<root>/test/<class>/...`` and optionally ``<root>/val/<class>/...`` (without
``val/``, the validation images are a seeded fraction of ``train/``). The images are decoded once
(with Pillow, as torchvision's ImageFolder reads them: PNG, JPEG, GIF, WEBP, ...), as grey or RGB, resized so that their
shorter side is ``image_size`` and centre-cropped to a square (or, with ``resize=false``, required to be
``image_size`` square already), and cached as uint8 tensors under ``<data_dir>/image_folders/``: a later
run reads the cache unless a file was added, removed or changed.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from PIL import UnidentifiedImageError
from pydantic import PositiveInt

from capsexp.config.arguments import UnitInterval, checked
from capsexp.config.image_folder_classes import class_names
from capsexp.data.base import InMemoryDataModule, LoaderOptions, data_folder_errors, partial_path, takes_options
from capsexp.data.images import IMAGE_SUFFIXES, decode, pil_mode, square
from capsexp.data.tensor_dataset import ImageTensorDataset
from capsexp.errors import ConfigError, CorruptDatasetError, DatasetNotFoundError

log = logging.getLogger("capsexp")

SPLITS = ("train", "val", "test")  # the sub-folders of a root split in advance
CACHE_VERSION = 1
_SHOWN = 5  # files named in an error, of all it concerns
_PROGRESS_EVERY = 10_000  # images decoded between progress lines


def _images_of(folder: Path, names: Sequence[str]) -> list[tuple[Path, int]]:
    """Every image file (by extension, as ImageFolder) in each class folder, with its class index; an
    error naming the class folders that hold none."""
    found, empty = [], []
    for index, name in enumerate(names):
        class_dir = folder / name
        files = sorted(p for p in class_dir.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            empty.append(str(class_dir))
        found += [(path, index) for path in files]
    if empty:
        raise DatasetNotFoundError(
            f"{len(empty)} class folder{'s' if len(empty) > 1 else ''} hold no images "
            f"({', '.join(IMAGE_SUFFIXES)}): {', '.join(empty[:_SHOWN])}{' ...' if len(empty) > _SHOWN else ''}"
        )
    return found


@checked
@takes_options(LoaderOptions)
class ImageFolderDataModule(InMemoryDataModule):
    """Images of one sub-folder per class (see the module's docstring), as an in-memory dataset.

    Args:
        root: the image folder.
        image_size: the images' side after resizing (the net's input size).
        channels: 1 (grey) or 3 (RGB); images are converted on decoding.
        resize: resize the shorter side to ``image_size`` and centre-crop; false: every image must
            already be ``image_size`` x ``image_size`` (an error lists those that are not).
        val_fraction: of the training images, held out for validation (where there is no ``val/``).
        test_fraction: of all images, held out for testing (where there is no ``test/``).
        Others: :class:`~capsexp.data.base.LoaderOptions` (the decoded images are cached in
            ``<data_dir>/image_folders/``; ``split_seed`` draws the fractions held out).
    """

    dataset_name = "image folder"
    files = ()

    def __init__(
        self,
        root: str | os.PathLike,
        image_size: PositiveInt = 28,
        channels: Literal[1, 3] = 1,
        resize: bool = True,
        val_fraction: UnitInterval = 0.1,
        test_fraction: UnitInterval = 0.1,
        **options: Any,
    ) -> None:
        super().__init__()
        root = str(Path(root).expanduser().resolve())
        self.save_arguments(locals())
        self.root = Path(root)
        self.data_folder = self.root  # what errors about unreadable folders name
        self._class_names: list[str] | None = None

    @property
    def class_names(self) -> list[str]:
        """The class sub-folders' names, sorted (as ImageFolder numbers them), read when first asked for
        (a trained model's preprocessing is rebuilt where its training images are not)."""
        if self._class_names is None:
            self._class_names = class_names(self.root)
        return self._class_names

    @property
    def dims(self) -> tuple[int, int, int]:
        return (self.hparams.channels, self.hparams.image_size, self.hparams.image_size)

    @property
    def split_in_advance(self) -> bool:
        return (self.root / "train").is_dir()

    def _files(self) -> dict[str, list[tuple[Path, int]]]:
        """The image files of each split sub-folder (``train``, ``val``, ``test``), or of the unsplit root (``all``)."""
        if not self.split_in_advance:
            return {"all": _images_of(self.root, self.class_names)}
        if not (self.root / "test").is_dir():
            raise DatasetNotFoundError(f"{self.root}: has train/ but no test/ folder (docs/data.md)")
        return {
            split: _images_of(self.root / split, self.class_names) for split in SPLITS if (self.root / split).is_dir()
        }

    @property
    def cache_path(self) -> Path:
        key = hashlib.sha1(
            repr((self.hparams.root, self.hparams.image_size, self.hparams.channels, self.hparams.resize)).encode()
        ).hexdigest()[:16]
        return self.data_dir / "image_folders" / f"{self.root.name}-{key}.pt"

    @data_folder_errors
    def prepare_data(self) -> None:
        """Decode every image once into the cache, unless it is up to date."""
        files = self._files()
        fingerprint = repr(
            {
                split: [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p, _ in found]
                for split, found in files.items()
            }
        )
        if self.cache_path.exists():
            cached = torch.load(self.cache_path, weights_only=True)
            if cached.get("version") == CACHE_VERSION and cached.get("fingerprint") == fingerprint:
                return
        cache = {"version": CACHE_VERSION, "fingerprint": fingerprint}
        for split, found in files.items():
            cache[split] = self._decode(found)
        self.cache_path.parent.mkdir(parents=True, exist_ok=True)
        partial = partial_path(self.cache_path)
        torch.save(cache, partial)
        partial.replace(self.cache_path)

    def _decode(self, found: list[tuple[Path, int]]) -> dict[str, torch.Tensor]:
        size, mode = self.hparams.image_size, pil_mode(self.hparams.channels)
        log.info(f"{self.root}: decoding {len(found):,} images to {self.hparams.channels}x{size}x{size}")
        images, unreadable, wrong_size = [], [], []
        for count, (path, _) in enumerate(found, start=1):
            if count % _PROGRESS_EVERY == 0:
                log.info(f"{self.root}: {count:,} of {len(found):,} images decoded")
            try:
                image = decode(path, mode)
            except (UnidentifiedImageError, OSError):
                unreadable.append(path)
                continue
            if self.hparams.resize:
                image = square(image, size)
            elif tuple(image.shape[-2:]) != (size, size):
                wrong_size.append(f"{path} ({image.shape[-1]}x{image.shape[-2]})")
                continue
            images.append(image)
        if unreadable:
            shown = ", ".join(map(str, unreadable[:_SHOWN])) + (" ..." if len(unreadable) > _SHOWN else "")
            raise CorruptDatasetError(
                f"{len(unreadable)} of {len(found):,} image files could not be read as images: {shown}\n"
                "Remove or replace them (or give them another extension, and they are left out)."
            )
        if wrong_size:
            raise ConfigError(
                f"data.resize=false, but {len(wrong_size)} of {len(found):,} images are not {size}x{size}: "
                f"{', '.join(wrong_size[:_SHOWN])}{' ...' if len(wrong_size) > _SHOWN else ''}\n"
                f"Set data.resize=true (shorter side to {size}, centre crop) or data.image_size to their size."
            )
        return {"images": torch.stack(images), "targets": torch.tensor([index for _, index in found])}

    @data_folder_errors
    def setup(self, stage: str | None = None) -> None:
        self.split_batch_over_processes()
        if self.data_train is not None:
            return
        cache = torch.load(self.cache_path, weights_only=True)
        if "all" in cache:
            full = ImageTensorDataset(cache["all"]["images"], cache["all"]["targets"])
            test, rest = self._fraction(torch.arange(len(full)), self.hparams.test_fraction, "test_fraction", 0)
            self.data_test = full.subset(test)
            train = full.subset(rest)
        else:
            self.data_test = ImageTensorDataset(cache["test"]["images"], cache["test"]["targets"])
            train = ImageTensorDataset(cache["train"]["images"], cache["train"]["targets"])
        log.info(f"{self.root}: {len(self.class_names)} classes: {', '.join(self.class_names)}")
        if "val" in cache:
            self.data_val, self.data_train = ImageTensorDataset(cache["val"]["images"], cache["val"]["targets"]), train
        else:
            validation, training = self._fraction(
                torch.arange(len(train)), self.hparams.val_fraction, "val_fraction", 1
            )
            self.data_val, self.data_train = train.subset(validation), train.subset(training)

    def _fraction(
        self, indices: torch.Tensor, fraction: float, key: str, stream: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(held out, rest)``: ``fraction`` of ``indices`` in an order drawn from ``split_seed``."""
        count = round(fraction * len(indices))
        if not 0 < count < len(indices):
            raise ConfigError(
                f"data.{key}={fraction}: holds out {count} of the {len(indices):,} images; it must leave at least "
                "one on each side"
            )
        generator = torch.Generator().manual_seed(2 * self.hparams.split_seed + stream)
        order = indices[torch.randperm(len(indices), generator=generator)]
        return order[:count], order[count:]

    def pixel_batch(self, batch: tuple[torch.Tensor, torch.Tensor], dataloader_idx: int) -> tuple:
        """uint8 -> float in [0, 1]."""
        images, targets = batch
        return images.float().div_(255), targets
