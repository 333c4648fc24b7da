"""What the in-memory DataModules share: the options they all take, their saved arguments, file lookup
and not-found message, the seeded train/validation split, the global batch split per process, and the
DataLoaders."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import http.client
import inspect
import os
import shutil
import typing
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.error import URLError

import lightning as L
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from pydantic import NonNegativeInt, PositiveInt
from torch.utils.data import DataLoader, Sampler

from capsexp.data.conventions import ImageConventions
from capsexp.data.device_loader import DeviceBatchLoader
from capsexp.data.resumable import EpochSampler, ResumableDataLoader, ResumableDeviceBatchLoader, step_generator
from capsexp.data.tensor_dataset import ImageTensorDataset, collate_batch
from capsexp.data.transforms import EvaluationTransform
from capsexp.errors import ConfigError, CorruptDatasetError, DataFolderError, DatasetNotFoundError
from capsexp.records.metric_names import PLAIN

Method = TypeVar("Method", bound=Callable)


def data_folder_errors(method: Method) -> Method:
    """A folder that cannot be created, read or written (``self.data_folder``) becomes a
    :class:`DataFolderError` that names it, instead of the OSError's chained tracebacks."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except OSError as error:
            culprit = error.filename or self.data_folder
            raise DataFolderError(
                f"data folder {self.data_folder}: {error.strerror or error} ({culprit})\n"
                "capsexp reads datasets there (and writes downloads, unpacked files and caches). Point it "
                "at a folder it can use: set CAPSEXP_DATA_DIR=/path/to/data or pass data.data_dir=/path/to/data."
            ) from None

    return wrapper  # type: ignore[return-value]


def partial_path(path: Path) -> Path:
    """Where a file is written before it is renamed to ``path``: a name of this process's own, so that
    processes preparing the same data folder at once (a multirun's jobs) never rename each other's."""
    return path.with_name(f"{path.name}.{os.getpid()}.partial")


def md5sum(path: Path, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


# A server silent this long fails the download with a message, instead of leaving the user waiting.
DOWNLOAD_TIMEOUT_S = 60


class DownloadFailed(Exception):
    """A download that did not complete; its message is the reason, for the caller's own message."""


def download(url: str, path: Path, md5: str | None = None) -> None:
    """``url`` saved as ``path``, written under another name first (:func:`partial_path`) and renamed
    when whole, so that an interrupted or corrupted download never takes the real name.

    Raises :class:`DownloadFailed` when the server cannot be reached, answers with an error, falls
    silent for ``DOWNLOAD_TIMEOUT_S``, or sends fewer bytes than it announced (a dropped connection
    just ends the stream); :class:`CorruptDatasetError` when ``md5`` is given and the file's differs.
    """
    partial = partial_path(path)
    try:
        # Opened outside the download's own errors: a folder that cannot be written is reported as the
        # folder's problem (capsexp.data.base.data_folder_errors), not as a failed download.
        with open(partial, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
                    shutil.copyfileobj(response, out)
                    announced = response.headers.get("Content-Length")
            except (URLError, OSError, http.client.HTTPException) as error:
                raise DownloadFailed(str(getattr(error, "reason", error))) from None
            received = out.tell()
        if announced is not None and received != int(announced):
            raise DownloadFailed(f"interrupted after {received} of {announced} bytes")
        if md5 is not None and md5sum(partial) != md5:
            raise CorruptDatasetError(f"{url}: the downloaded file's md5 differs from the official one")
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)


# The fixed evaluation sets a seed draws, each from a stream of its own: validation (split 0), test
# (split 1) and capsexp.data.mnist's affine test set.
AFFINE_SPLIT = 2
EVALUATION_STREAMS = AFFINE_SPLIT + 1


def evaluation_generator(seed: int, split: int) -> torch.Generator:
    """The generator of a fixed evaluation set drawn at random (positions, pairs): one stream of its
    own per (seed, split), so that no two sets share their draws, under one seed or across seeds."""
    if not 0 <= split < EVALUATION_STREAMS:
        raise ValueError(f"evaluation_generator: split={split}: must be 0 to {EVALUATION_STREAMS - 1}")
    return torch.Generator().manual_seed(EVALUATION_STREAMS * seed + split)


@dataclasses.dataclass(frozen=True)
class LoaderOptions:
    """The options every in-memory DataModule takes beside its own (:func:`takes_options`).

    Args:
        data_dir: the folder holding the dataset's folder (:attr:`InMemoryDataModule.data_folder`).
        batch_size: the global batch size; each of the run's processes gets an equal share.
        split_seed: seed of the held-out splits, independent of the run's seed.
        num_workers: DataLoader workers. 0 is fastest here: batches are gathered from memory.
        pin_memory: the DataLoader's ``pin_memory``.
        on_device: keep the datasets on the accelerator and draw batches there (no DataLoader, no
            host-to-device copies); ``"auto"``: wherever the run's device is not the CPU.
    """

    data_dir: str | os.PathLike = "data"
    batch_size: PositiveInt = 32
    split_seed: int = 0
    num_workers: NonNegativeInt = 0
    pin_memory: bool = False
    on_device: bool | Literal["auto"] = "auto"


@dataclasses.dataclass(frozen=True)
class OfficialFileOptions(LoaderOptions):
    """The options of a DataModule read from a dataset's official files, beside :class:`LoaderOptions`.

    Args:
        val_size: training images held out for validation (drawn with ``split_seed``).
        download: download missing files in ``prepare_data``.
        verify_checksums: check every file against its official md5; turn off for your own files in
            the official format.
    """

    val_size: PositiveInt = 5000
    download: bool = True
    verify_checksums: bool = True


DataModule = TypeVar("DataModule", bound=type)


def takes_options(options: type) -> Callable[[DataModule], DataModule]:
    """A DataModule whose constructor takes the fields of ``options`` (:class:`LoaderOptions`, ...)
    beside the parameters it declares, gathered in its ``**options``.

    Its signature, which the config checks, ``@checked`` and Hydra read, lists them all: the
    constructor's required parameters, then the shared options, then its own. A shared option the
    constructor declares itself keeps its place and takes the constructor's default and hint (smallNORB's
    ``val_size``). Every shared option reaches ``**options``, at its default where not given."""

    def decorate(cls: DataModule) -> DataModule:
        init = cls.__init__
        *own, gathered = list(inspect.signature(init).parameters.values())[1:]
        if gathered.kind is not inspect.Parameter.VAR_KEYWORD or gathered.name != "options":
            raise TypeError(f"{cls.__qualname__}.__init__ must end in **options to take {options.__name__}")
        own_hints = typing.get_type_hints(init, include_extras=True)
        shared_hints = typing.get_type_hints(options, include_extras=True)
        declared = {p.name: p for p in own}
        shared = [
            declared.get(f.name)
            or inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=f.default)
            for f in dataclasses.fields(options)
        ]
        rest = [p for p in own if p.name not in shared_hints]
        required = [p for p in rest if p.default is inspect.Parameter.empty]
        optional = [p for p in rest if p.default is not inspect.Parameter.empty]
        hints = shared_hints | own_hints
        parameters = [p.replace(annotation=hints[p.name]) for p in (*required, *shared, *optional)]
        signature = inspect.Signature(
            [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), *parameters], return_annotation=None
        )

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            init(**bound.arguments)

        functools.update_wrapper(__init__, init)
        del __init__.__wrapped__  # the signature is this one, not the constructor's with **options
        __init__.__signature__ = signature
        __init__.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": None}
        cls.__init__ = __init__
        return cls

    return decorate


class InMemoryDataModule(L.LightningDataModule):
    """Datasets held as :class:`ImageTensorDataset` (whole batches gathered by one indexing operation).

    Subclasses take :class:`LoaderOptions` (:func:`takes_options`), set ``data_train``, ``data_val`` and
    ``data_test`` in ``setup`` and call :meth:`split_batch_over_processes` there (``on_device``: see
    :class:`DeviceBatchLoader`).

    ``test_set_names`` declares the test sets, one per test DataLoader (:mod:`capsexp.records.metric_names`):
    one plain test set unless a subclass says otherwise.
    """

    dataset_name: str  # as errors name it: "MNIST"
    files: Sequence[str]  # the official files, each plain or .gz in data_folder
    data_folder: Path  # where the dataset's files live (named in errors)
    test_set_names: Sequence[str] = (PLAIN,)  # a property in subclasses where it varies
    extra_tests: tuple[ImageTensorDataset, ...] = ()  # the test sets after the first, in test_set_names' order
    objects_per_image = 1  # targets (N,); with more, (N, objects) (capsexp.lit.classifier)

    data_train: ImageTensorDataset | None = None
    data_val: ImageTensorDataset | None = None
    data_test: ImageTensorDataset | None = None

    def __init__(self) -> None:
        super().__init__()
        # (id(dataset), device) -> the dataset's tensors there, for data.on_device
        self._device_copies: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}

    # ---- construction ---------------------------------------------------------------------------
    def save_arguments(self, arguments: Mapping[str, Any]) -> None:
        """Save a constructor's arguments as hyperparameters: call ``self.save_arguments(locals())``
        from ``__init__`` before defining any other local name; the shared ones, gathered in
        ``**options`` (:func:`takes_options`), are saved beside the others (checkpoints keep them, and
        they load with ``torch.load(weights_only=True)``: ``data_dir`` becomes a resolved ``str``)."""
        own = {name: value for name, value in arguments.items() if name not in ("self", "__class__", "options")}
        # Given the arguments, Lightning still reads the calling constructors' locals by their signatures,
        # which name the shared options the body holds in **options: it is handed a frame with no callers.
        outermost = inspect.currentframe()
        while outermost.f_back is not None:
            outermost = outermost.f_back
        self.save_hyperparameters({**arguments.get("options", {}), **own}, frame=outermost, logger=False)
        self.hparams.data_dir = str(Path(self.hparams.data_dir).expanduser().resolve())
        self.data_dir = Path(self.hparams.data_dir)
        self.batch_size_per_device = self.hparams.batch_size

    # ---- files ------------------------------------------------------------------------------------
    def source_of(self, name: str) -> Path | None:
        """The file ``name`` in the data folder, plain or ``.gz`` (plain first); None when missing."""
        for candidate in (self.data_folder / name, self.data_folder / f"{name}.gz"):
            if candidate.exists():
                return candidate
        return None

    def not_found(self, missing: Sequence[str], reason: str) -> DatasetNotFoundError:
        """The error for missing files: which are there, which are not, why, and where to point capsexp."""
        listed = "\n".join(f"  {name}{'' if name in missing else '  (found)'}" for name in self.files)
        holding = self.data_folder.relative_to(self.data_dir) if self.data_folder.is_relative_to(self.data_dir) else ""
        return DatasetNotFoundError(
            f"{self.dataset_name} not found in {self.data_folder}\n"
            f"Expected the {len(self.files)} official files there, plain or .gz:\n{listed}\n{reason}\n"
            f"Put the files there, or point capsexp at a folder holding {holding}/: "
            "set CAPSEXP_DATA_DIR=/path/to/data or pass data.data_dir=/path/to/data."
        )

    def split_off_validation(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(validation, training)``: ``indices`` in an order drawn with ``split_seed`` (independent of
        the run's seed), its first ``val_size`` for validation."""
        val_size = self.hparams.val_size
        if not 0 < val_size < len(indices):
            # Only the data knows its size: a config error found when it is read, before training.
            raise ConfigError(
                f"data.val_size={val_size}: must be less than the {len(indices):,} training images it is "
                f"split from (e.g. data.val_size={max(1, len(indices) // 12)})"
            )
        order = indices[torch.randperm(len(indices), generator=torch.Generator().manual_seed(self.hparams.split_seed))]
        return order[:val_size], order[val_size:]

    # ---- processes and loaders --------------------------------------------------------------------
    def split_batch_over_processes(self) -> None:
        """``batch_size`` is global: each of the run's processes gets an equal share."""
        world_size = self.trainer.world_size if self.trainer is not None else 1
        if self.hparams.batch_size % world_size:
            raise ConfigError(
                f"data.batch_size={self.hparams.batch_size} (the global batch) is not divisible by "
                f"the {world_size} processes of this run"
            )
        self.batch_size_per_device = self.hparams.batch_size // world_size

    def _evaluation_sampler(self, dataset: ImageTensorDataset) -> Sampler | None:
        """Over several processes, each evaluates a disjoint share of the set, every image once.

        Lightning's default DistributedSampler pads the shares to equal length with repeated images,
        which would bias validation and test accuracy; shares here differ by at most one image. That
        is safe in evaluation: DDP syncs buffers only on the first batch without gradients.
        """
        if self.trainer is None or self.trainer.world_size == 1:
            return None
        return UnrepeatedDistributedSampler(
            dataset, num_replicas=self.trainer.world_size, rank=self.trainer.global_rank, shuffle=False
        )

    def data_device(self) -> torch.device | None:
        """The device batches are drawn on (``on_device``), or None for the DataLoader path."""
        choice = self.hparams.get("on_device", False)
        strategy = getattr(self.trainer, "strategy", None)  # None outside a Trainer
        if strategy is None or choice is False:
            return None
        device = strategy.root_device
        return None if choice == "auto" and device.type == "cpu" else device

    def _device_copy(self, dataset: ImageTensorDataset, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The dataset's tensors on ``device``, copied once (the test set's rotations share one copy)."""
        key = (id(dataset), str(device))
        if key not in self._device_copies:
            self._device_copies[key] = tuple(tensor.to(device) for tensor in dataset.tensors)
        return self._device_copies[key]

    def _training_sampler(self, dataset: ImageTensorDataset) -> EpochSampler:
        """The training order, this process's share under DDP (as Lightning would shard it)."""
        trainer = self.trainer
        if trainer is None:  # outside a Trainer: one process
            return EpochSampler(dataset)
        return EpochSampler(dataset, num_replicas=trainer.world_size, rank=trainer.global_rank)

    def _loader(self, dataset: ImageTensorDataset, shuffle: bool) -> DataLoader | DeviceBatchLoader:
        """Training (``shuffle``): a resumable loader over :class:`EpochSampler`; else the stored
        order (each process its share under DDP). On the device or through a DataLoader."""
        device = self.data_device()
        sampler = self._training_sampler(dataset) if shuffle else self._evaluation_sampler(dataset)
        if device is not None:
            images, targets = self._device_copy(dataset, device)
            if shuffle:
                return ResumableDeviceBatchLoader(images, targets, self.batch_size_per_device, sampler)
            return DeviceBatchLoader(images, targets, self.batch_size_per_device, sampler=sampler)
        options = dict(
            batch_size=self.batch_size_per_device,
            collate_fn=collate_batch,
            num_workers=self.hparams.num_workers,
            pin_memory=self.hparams.pin_memory,
            persistent_workers=self.hparams.num_workers > 0,
        )
        if shuffle:
            return ResumableDataLoader(dataset, sampler, **options)
        return DataLoader(dataset, sampler=sampler, **options)

    # ---- on the device: pixels, then the net's input -----------------------------------------
    def pixel_batch(self, batch: tuple[torch.Tensor, ...], dataloader_idx: int) -> tuple[torch.Tensor, ...]:
        """A batch as ``(images, targets)`` with pixels in [0, 1], augmented in training: what an
        attack perturbs (:mod:`capsexp.attacks`). Subclasses that store uint8 images override it."""
        return batch

    def input_transform(self, images: torch.Tensor) -> torch.Tensor:
        """The net's input from pixels in [0, 1]: :meth:`EvaluationTransform.normalized` of
        :attr:`evaluation_transform` (a standardisation, or none); differentiable, as attacks take gradients
        through it."""
        return self.evaluation_transform.normalized(images)

    def on_after_batch_transfer(self, batch: tuple[torch.Tensor, ...], dataloader_idx: int) -> tuple:
        images, *rest = self.pixel_batch(batch, dataloader_idx)
        return (self.input_transform(images), *rest)

    # ---- a user's images, as the evaluation sets reach the net (capsexp.use.inference) ------------
    @property
    def evaluation_size(self) -> int:
        """The side of the evaluation sets' stored images (before :meth:`pixel_batch`): the net's input
        size unless a subclass stores them larger (a centre crop follows)."""
        return self.dims[-1]

    @property
    def class_names(self) -> list[str]:
        """The classes' names, in the order of the targets; the class numbers unless a subclass has names."""
        return [str(j) for j in range(self.num_classes)]

    @property
    def image_conventions(self) -> ImageConventions:
        """How the evaluation images look (:mod:`capsexp.data.conventions`): of :attr:`evaluation_size`;
        no polarity, no framing unless a subclass declares them. Read without the dataset's files."""
        return ImageConventions(size=self.evaluation_size)

    @property
    def evaluation_transform(self) -> EvaluationTransform:
        """How an image becomes the net's input as the evaluation batches do (:mod:`capsexp.data.transforms`):
        :attr:`image_conventions`, then pixels to [0, 1], the centre crop to the net's input where the
        images are stored larger, and no standardisation unless a subclass declares one. Read without the
        dataset's files."""
        side = self.dims[-1]
        return EvaluationTransform(
            channels=self.dims[0],
            conventions=self.image_conventions,
            crop=side if side != self.evaluation_size else None,
        )

    def augmentation_generator(self, device: torch.device) -> torch.Generator:
        """The generator random training augmentations draw from: seeded by the run's seed, the step
        and the process, so a resumed run augments as the uninterrupted one (:func:`step_generator`)."""
        return step_generator(device, self.trainer.global_step, self.trainer.global_rank)

    def train_dataloader(self) -> DataLoader | DeviceBatchLoader:
        return self._loader(self.data_train, shuffle=True)

    def val_dataloader(self) -> DataLoader | DeviceBatchLoader:
        return self._loader(self.data_val, shuffle=False)

    def test_dataloader(self) -> DataLoader | DeviceBatchLoader | list[DataLoader | DeviceBatchLoader]:
        """The test set's loader, or one per test set where there are extra ones (``test_set_names``)."""
        if self.extra_tests:
            return [self._loader(dataset, shuffle=False) for dataset in (self.data_test, *self.extra_tests)]
        return self._loader(self.data_test, shuffle=False)
