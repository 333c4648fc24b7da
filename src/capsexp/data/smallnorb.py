"""smallNORB (LeCun, Huang & Bottou 2004) as a LightningDataModule, with the EM-capsule paper's protocol.

The six official files (``*-{dat,cat,info}.mat``, plain or ``.gz``) live in ``<data_dir>/smallnorb/``.
``prepare_data`` downloads what is missing (atomically: a partial download never looks complete),
checks every file (format, shape, value ranges and, by default, the official md5) and caches the
images downsampled 96 -> 48 once, next to the files; the cache is rebuilt when a source file changes.
Batches stay uint8 until the device, where training images get a random 32x32 crop with random
brightness and contrast and test images the centre crop, then per-image standardisation (section 5).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import NonNegativeFloat, PositiveFloat, PositiveInt

from capsexp.config.arguments import checked
from capsexp.data.augment import center_crop, random_brightness_contrast, random_crop
from capsexp.data.base import (
    DownloadFailed,
    InMemoryDataModule,
    OfficialFileOptions,
    data_folder_errors,
    download,
    md5sum,
    partial_path,
    takes_options,
)
from capsexp.data.conventions import ImageConventions
from capsexp.data.images import downsampled
from capsexp.data.norb_format import SMALLNORB_FILES, read_matrix
from capsexp.data.tensor_dataset import ImageTensorDataset
from capsexp.data.transforms import EvaluationTransform
from capsexp.errors import CorruptDatasetError
from capsexp.records.metric_names import PLAIN

PREFIX = {"train": "smallnorb-5x46789x9x18x6x2x96x96-training", "test": "smallnorb-5x01235x9x18x6x2x96x96-testing"}
INFO_FIELDS = ("instance", "elevation", "azimuth", "lighting")
INFO_MAX = (9, 8, 34, 5)  # instance 0-9, elevation 0-8 (30-70 degrees), azimuth 0, 2, .., 34 (x10 deg), lighting 0-5
# Section 5.1: train on azimuths 300, 320, 340, 0, 20, 40 degrees (info value = degrees / 10), or on
# the 3 lowest elevations (30, 35, 40 degrees).
TRAIN_AZIMUTHS = (30, 32, 34, 0, 2, 4)
TRAIN_ELEVATIONS = (0, 1, 2)
CACHE_VERSION = 1


IMAGE_SIZE = 96  # the official images' side
CLASS_NAMES = ("animal", "human", "airplane", "truck", "car")  # the category numbers 0-4 of the -cat files


@checked
@takes_options(OfficialFileOptions)
class SmallNORBDataModule(InMemoryDataModule):
    """smallNORB: 5 categories of toys, 24,300 stereo training pairs and 24,300 test pairs.

    Args:
        val_size: training samples held out for validation (fixed ``split_seed``); fewer than the
            other datasets' by default, as the training set is smaller.
        base_url: where the official ``.gz`` files are served (``download`` fetches missing ones from it).
        stereo: ``both`` (2 channels, as the official code), ``left`` (1 channel) or ``split`` (each
            view its own 1-channel sample).
        viewpoint: ``null`` (all data), ``azimuth`` or ``elevation``: the novel-viewpoint protocol of
            section 5.1. Training keeps the azimuths 300-40 degrees, or the 3 lowest elevations.
        familiar: with ``viewpoint``: test on the training viewpoints (true) or on the others (false).
        extra_test_sets: ``[novel]``, with ``viewpoint`` and ``familiar``: the novel viewpoints as a
            second test set (``test/acc_novel``) beside the familiar ones, from the same checkpoint.
        resize, crop_size: the 96x96 images are downsampled once to ``resize`` (48), then cropped to
            ``crop_size`` (32): randomly in training, centred for evaluation.
        brightness, contrast: training jitter: a brightness offset in [-brightness, brightness] (pixel
            scale [0, 1]) and a contrast factor in [contrast[0], contrast[1]], per image. Defaults are
            those of the TensorFlow CIFAR-10 input pipeline that public smallNORB ports follow. As
            there, the per-image standardisation that follows removes the brightness offset (it is
            added to every pixel) and the contrast factor but for the two views' different means.
        Others: :class:`~capsexp.data.base.OfficialFileOptions` (``data_dir`` holds ``smallnorb/`` with
            the six official files, plain or ``.gz``).
    """

    dataset_name = "smallNORB"
    files = tuple(SMALLNORB_FILES)
    num_classes = 5

    def __init__(
        self,
        val_size: PositiveInt = 1000,
        base_url: str = "https://cs.nyu.edu/~ylclab/data/norb-v1.0-small/",
        stereo: Literal["both", "left", "split"] = "both",
        viewpoint: Literal["azimuth", "elevation"] | None = None,
        familiar: bool = True,
        extra_test_sets: Sequence[Literal["novel"]] = (),
        resize: PositiveInt = 48,
        crop_size: PositiveInt = 32,
        brightness: NonNegativeFloat = 63 / 255,
        contrast: tuple[PositiveFloat, PositiveFloat] = (0.2, 1.8),
        **options: Any,
    ) -> None:
        super().__init__()
        if extra_test_sets and (viewpoint is None or not familiar):
            raise ValueError(
                f"extra_test_sets={list(extra_test_sets)} tests the novel viewpoints beside the familiar ones: "
                "it needs data.viewpoint=azimuth or elevation and data.familiar=true"
            )
        contrast = tuple(contrast)  # saved as a tuple (a ListConfig would not load weights-only)
        extra_test_sets = list(extra_test_sets)
        self.save_arguments(locals())
        self.data_folder = self.data_dir / "smallnorb"

    @property
    def dims(self) -> tuple[int, int, int]:
        return (2 if self.hparams.stereo == "both" else 1, self.hparams.crop_size, self.hparams.crop_size)

    @property
    def evaluation_size(self) -> int:
        return self.hparams.resize

    @property
    def class_names(self) -> list[str]:
        return list(CLASS_NAMES)

    @property
    def image_conventions(self) -> ImageConventions:
        """Of the evaluation size (``resize``); an image of the official 96x96 is downsampled as the
        dataset's own images are (area averaging)."""
        return ImageConventions(size=self.evaluation_size, official_size=IMAGE_SIZE)

    @property
    def evaluation_transform(self) -> EvaluationTransform:
        """The centre crop, then per-image standardisation, as the authors' input pipeline."""
        return dataclasses.replace(super().evaluation_transform, per_image_standardization=True)

    @property
    def test_set_names(self) -> list[str]:
        """One name per test DataLoader (:mod:`capsexp.records.metric_names`): the plain set, then the novel
        viewpoints where asked for."""
        return [PLAIN, *self.hparams.extra_test_sets]

    @property
    def cache_path(self) -> Path:
        return self.data_folder / f"smallnorb-{self.hparams.resize}x{self.hparams.resize}.pt"

    # ---- files -------------------------------------------------------------------------------
    @data_folder_errors
    def prepare_data(self) -> None:
        """Download missing files, check all six, and build the downsampled cache if it is stale."""
        missing = [name for name in self.files if self.source_of(name) is None]
        if missing:
            self._download(missing)
        sources = {name: self.source_of(name) for name in self.files}
        fingerprint = {
            name: (path.name, path.stat().st_size, path.stat().st_mtime_ns) for name, path in sources.items()
        }
        if self.cache_path.exists():
            cached = torch.load(self.cache_path, weights_only=True)
            verified = cached.get("verified", False) or not self.hparams.verify_checksums
            if cached.get("fingerprint") == repr(fingerprint) and cached.get("version") == CACHE_VERSION and verified:
                return  # a cache made with data.verify_checksums=false is checked when they are asked for
        if self.hparams.verify_checksums:
            for name, path in sources.items():
                expected = SMALLNORB_FILES[name][0 if path.suffix == ".gz" else 1]
                if md5sum(path) != expected:
                    raise CorruptDatasetError(
                        f"{path}: md5 differs from the official smallNORB file. Delete it and download it "
                        "again; for your own data in the official format, pass data.verify_checksums=false."
                    )
        cache = {"version": CACHE_VERSION, "fingerprint": repr(fingerprint), "verified": self.hparams.verify_checksums}
        for split, prefix in PREFIX.items():
            cache[split] = self._read_split(sources, prefix)
        partial = partial_path(self.cache_path)
        torch.save(cache, partial)
        partial.replace(self.cache_path)

    def _read_split(self, sources: dict[str, Path], prefix: str) -> dict[str, torch.Tensor]:
        images = read_matrix(sources[f"{prefix}-dat.mat"], expected_shape=(None, 2, IMAGE_SIZE, IMAGE_SIZE))
        count = images.shape[0]
        categories = read_matrix(sources[f"{prefix}-cat.mat"], expected_shape=(count,))
        info = read_matrix(sources[f"{prefix}-info.mat"], expected_shape=(count, 4))
        if categories.size and not 0 <= categories.min() <= categories.max() <= 4:
            raise CorruptDatasetError(f"{sources[f'{prefix}-cat.mat']}: categories outside 0-4")
        for column, (field, largest) in enumerate(zip(INFO_FIELDS, INFO_MAX, strict=True)):
            values = info[:, column]
            if values.size and not 0 <= values.min() <= values.max() <= largest:
                raise CorruptDatasetError(f"{sources[f'{prefix}-info.mat']}: {field} outside 0-{largest}")
        return {
            "images": downsampled(torch.from_numpy(images.copy()), self.hparams.resize),
            "targets": torch.from_numpy(categories.astype("int64")),
            "info": torch.from_numpy(info.astype("int64")),
        }

    def _download(self, missing: list[str]) -> None:
        if not self.hparams.download:
            raise self.not_found(missing, "Downloading is off (data.download=false).")
        self.data_folder.mkdir(parents=True, exist_ok=True)
        for name in missing:
            url = f"{self.hparams.base_url.rstrip('/')}/{name}.gz"
            md5 = SMALLNORB_FILES[name][0] if self.hparams.verify_checksums else None
            try:
                download(url, self.data_folder / f"{name}.gz", md5)
            except DownloadFailed as error:
                raise self.not_found(missing, f"Download of {url} failed: {error}") from None

    # ---- datasets ----------------------------------------------------------------------------
    def _dataset(self, split: dict[str, torch.Tensor], keep: torch.Tensor) -> ImageTensorDataset:
        images, targets, info = split["images"][keep], split["targets"][keep], split["info"][keep]
        stereo = self.hparams.stereo
        if stereo == "left":
            images = images[:, :1]
        elif stereo == "split":  # each view its own sample: (N, 2, H, W) -> (2N, 1, H, W)
            images = images.reshape(-1, 1, *images.shape[-2:])
            targets, info = targets.repeat_interleave(2), info.repeat_interleave(2, dim=0)
        extras = {field: info[:, column] for column, field in enumerate(INFO_FIELDS)}
        return ImageTensorDataset(images.contiguous(), targets, extras)

    def _viewpoint_mask(self, info: torch.Tensor, training: bool, familiar: bool | None = None) -> torch.Tensor:
        """The samples of the training viewpoints (``training``), else of the test's: the familiar ones or the
        novel ones, as ``familiar`` (default: ``data.familiar``) says."""
        viewpoint = self.hparams.viewpoint
        if viewpoint is None:
            return torch.ones(len(info), dtype=torch.bool)
        column, trained = (2, TRAIN_AZIMUTHS) if viewpoint == "azimuth" else (1, TRAIN_ELEVATIONS)
        seen = torch.isin(info[:, column], torch.tensor(trained))
        familiar = self.hparams.familiar if familiar is None else familiar
        return seen if training or familiar else ~seen

    @data_folder_errors
    def setup(self, stage: str | None = None) -> None:
        self.split_batch_over_processes()
        if self.data_test is not None and self.data_train is not None:
            return
        cache = torch.load(self.cache_path, weights_only=True)
        train = cache["train"]
        keep = self._viewpoint_mask(train["info"], training=True).nonzero().squeeze(1)
        validation, training = self.split_off_validation(keep)
        self.data_val = self._dataset(train, validation.sort().values)
        self.data_train = self._dataset(train, training.sort().values)
        test = cache["test"]
        self.data_test = self._dataset(test, self._viewpoint_mask(test["info"], training=False).nonzero().squeeze(1))
        self.extra_tests = tuple(
            self._dataset(test, self._viewpoint_mask(test["info"], training=False, familiar=False).nonzero().squeeze(1))
            for _ in self.hparams.extra_test_sets  # "novel", the one extra set
        )

    # ---- on the device -----------------------------------------------------------------------
    def pixel_batch(self, batch: tuple[torch.Tensor, torch.Tensor], dataloader_idx: int) -> tuple:
        """uint8 -> [0, 1]; random crop + brightness/contrast (training) or centre crop."""
        images, targets = batch
        images = images.float().div_(255)
        if self.trainer is not None and self.trainer.training:
            generator = self.augmentation_generator(images.device)
            images = random_crop(images, self.hparams.crop_size, generator)
            images = random_brightness_contrast(images, self.hparams.brightness, self.hparams.contrast, generator)
        else:
            images = center_crop(images, self.hparams.crop_size)
        return images, targets
