"""MultiMNIST pairs (Sabour, Frosst & Hinton 2017, section 6.1): a digit overlaid on a digit of another
class from the same split, each shifted by up to ``shift`` pixels in each direction on a square
canvas, the pixel values summed and clipped to [0, 1].

The paper: 28x28 digits on a 36x36 canvas (4 pixels of padding), shifts up to 4 pixels. The official
generator's variant pads 4 and shifts up to 6 (``shift=6``, a 40x40 canvas). Pairs are drawn on the
device the images live on, from a ``torch.Generator``: the same seed gives the same pairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from pydantic import NonNegativeInt, PositiveInt
from torch.utils.data import Dataset

from capsexp.config.arguments import checked
from capsexp.data.base import OfficialFileOptions, data_folder_errors, evaluation_generator, takes_options
from capsexp.data.conventions import ImageConventions
from capsexp.data.mnist import DIGIT_SIZE, MNISTFiles, digit_conventions


class Pairs(NamedTuple):
    images: torch.Tensor  # (N, 1, S, S): the clipped sum of the two components
    components: torch.Tensor  # (N, 2, 1, S, S): each digit alone on the canvas (reconstruction targets)
    labels: torch.Tensor  # (N, 2): the base digit's class, then the overlaid one's
    shifts: torch.Tensor  # (N, 2, 2): (rows, columns) each component was shifted by


def translate(images: torch.Tensor, rows: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """Each image (N, H, W) moved down by ``rows[n]`` and right by ``columns[n]`` pixels, zeros shifted in."""
    count, height, width = images.shape
    source_rows = torch.arange(height, device=images.device) - rows[:, None]  # (N, H)
    source_columns = torch.arange(width, device=images.device) - columns[:, None]  # (N, W)
    inside = ((source_rows >= 0) & (source_rows < height))[:, :, None] & (
        (source_columns >= 0) & (source_columns < width)
    )[:, None, :]
    moved = images[
        torch.arange(count, device=images.device)[:, None, None],
        source_rows.clamp(0, height - 1)[:, :, None],
        source_columns.clamp(0, width - 1)[:, None, :],
    ]
    return moved * inside


def partners(labels: torch.Tensor, generator: torch.Generator, pool: torch.Tensor | None = None) -> torch.Tensor:
    """For each label, the index in ``pool`` (the labels of the digits partners come from; default
    ``labels`` itself) of a digit of another class: the class drawn uniformly among the other classes
    of the pool, the digit uniformly within it."""
    pool = labels if pool is None else pool
    classes, counts = torch.unique(pool, return_counts=True)
    if len(classes) < 2:
        raise ValueError(f"MultiMNIST pairs need digits of at least two classes, got only class {classes.tolist()}")
    device = labels.device
    by_class = torch.argsort(pool, stable=True)  # indices grouped by class, classes in ascending order
    starts = torch.cumsum(counts, 0) - counts
    own = torch.searchsorted(classes, labels)  # each digit's class, as a position in `classes`
    offset = torch.randint(1, len(classes), (len(labels),), generator=generator, device=device)
    other = (own + offset) % len(classes)
    within = (torch.rand(len(labels), generator=generator, device=device) * counts[other]).long()
    return by_class[starts[other] + within.clamp(max=counts[other] - 1)]


def random_shifts(count: int, shift: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """(count, 2, 2): for each pair, the (rows, columns) shift of each component, uniform in [-shift, shift]."""
    return torch.randint(-shift, shift + 1, (count, 2, 2), generator=generator, device=device)


def check_canvas(digit_size: int, shift: int, canvas: int) -> None:
    """A ValueError unless a centred ``digit_size`` digit shifted by up to ``shift`` pixels stays on the canvas."""
    if canvas < digit_size:
        raise ValueError(f"canvas={canvas} is smaller than the {digit_size}x{digit_size} digits")
    if shift > (canvas - digit_size) // 2:
        raise ValueError(
            f"shift={shift} pushes a {digit_size}x{digit_size} digit off a {canvas}x{canvas} canvas "
            f"(at most {(canvas - digit_size) // 2}; canvas={digit_size + 2 * shift} allows shift={shift})"
        )


def compose(
    first: torch.Tensor, second: torch.Tensor, shifts: torch.Tensor, canvas: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images (N, 1, S, S), components (N, 2, 1, S, S))``: each digit (N, H, W) centred on the canvas
    and shifted by its row of ``shifts`` (N, 2, 2); the image is their sum clipped to [0, 1]."""
    height, width = first.shape[-2:]
    top, left = (canvas - height) // 2, (canvas - width) // 2
    centred = first.new_zeros(2, len(first), canvas, canvas)
    centred[0, :, top : top + height, left : left + width] = first
    centred[1, :, top : top + height, left : left + width] = second
    components = torch.stack(
        [translate(centred[k], shifts[:, k, 0], shifts[:, k, 1]) for k in range(2)], dim=1
    ).unsqueeze(2)
    return components.sum(1).clamp(0, 1), components


@checked
def overlay_pairs(
    digits: torch.Tensor,
    labels: torch.Tensor,
    generator: torch.Generator,
    shift: NonNegativeInt = 4,
    canvas: PositiveInt = 36,
) -> Pairs:
    """One MultiMNIST example per digit in ``digits`` (N, H, W) or (N, 1, H, W), values in [0, 1]: the
    digit, and a partner of another class (:func:`partners`), each centred on a ``canvas`` x ``canvas``
    field and shifted independently by up to ``shift`` pixels in each direction."""
    digits = digits.reshape(len(digits), *digits.shape[-2:])
    height, width = digits.shape[-2:]
    check_canvas(max(height, width), shift, canvas)
    other = partners(labels, generator)
    shifts = random_shifts(len(digits), shift, generator, digits.device)
    images, components = compose(digits, digits[other], shifts, canvas)
    return Pairs(images, components, torch.stack([labels, labels[other]], 1), shifts)


class PairBatch(NamedTuple):
    """A MultiMNIST batch on the device."""

    images: torch.Tensor  # (N, 1, S, S) in [0, 1]
    targets: torch.Tensor  # (N, 2): the classes of the two digits
    components: torch.Tensor  # (N, 2, 1, S, S): each digit alone, the reconstruction targets


class PairSpecs(Dataset):
    """Pairs as indices into the digits of a split: ``specs`` (N, 6) int32 rows ``(first, second,
    first's rows, first's columns, second's rows, second's columns)`` (a training set holds the first
    column only: partners and shifts are drawn for each batch) and ``targets`` (N,) or (N, 2).
    The images are composed on the device (:meth:`MultiMNISTDataModule.on_after_batch_transfer`): a
    pair costs 40 bytes with its labels, not 1,296 for its image, so the paper's 10M test pairs fit
    in memory."""

    def __init__(self, specs: torch.Tensor, targets: torch.Tensor) -> None:
        self.specs, self.targets = specs, targets

    @property
    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.specs, self.targets

    def __len__(self) -> int:
        return len(self.specs)

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(indices, dtype=torch.long)
        return self.specs[index], self.targets[index]


@checked
@takes_options(OfficialFileOptions)
class MultiMNISTDataModule(MNISTFiles):
    """MultiMNIST (Sabour et al. 2017, section 6.1) from the MNIST files: each example a digit overlaid
    on a digit of another class from the same split (:func:`overlay_pairs`), batches
    :class:`PairBatch` ``(images, targets (N, 2), components)``.

    Training pairs are drawn afresh for every batch from the run's seed and step (so every epoch sees
    new pairs and a resumed run the same ones); validation and test pairs are fixed by ``pair_seed``.
    Only indices are stored; images are composed where the batch lives (the accelerator with
    ``on_device``).

    Args:
        shift, canvas: each digit is centred on a ``canvas`` x ``canvas`` field and shifted by up to
            ``shift`` pixels in each direction (the paper: 4 and 36; the official generator: 6 and 40).
        pairs_per_digit: validation and test pairs made with each digit as the first one (the paper:
            1,000, giving 10M test pairs; 1 by default).
        pair_seed: seed of the validation and test pairs, independent of the run's seed.
        Others: :class:`~capsexp.data.base.OfficialFileOptions` (the files: as
            :class:`~capsexp.data.MNISTDataModule`'s).
    """

    objects_per_image = 2

    def __init__(
        self,
        shift: NonNegativeInt = 4,
        canvas: PositiveInt = 36,
        pairs_per_digit: PositiveInt = 1,
        pair_seed: int = 0,
        **options: Any,
    ) -> None:
        check_canvas(DIGIT_SIZE, shift, canvas)
        super().__init__()
        self.save_arguments(locals())
        self.digits: torch.Tensor | None = None  # (70000, 28, 28) uint8: the training digits, then the test ones
        self.labels: torch.Tensor | None = None
        # Indices into `digits` of each split's digits (partners come from the same split).
        self._train_pool = self._validation_pool = self._test_pool = torch.empty(0, dtype=torch.long)
        self._on_device: dict[str, tuple[torch.Tensor, ...]] = {}

    @property
    def dims(self) -> tuple[int, int, int]:
        """(channels, height, width) of the images."""
        return (1, self.hparams.canvas, self.hparams.canvas)

    @data_folder_errors
    def setup(self, stage: str | None = None) -> None:
        self.split_batch_over_processes()
        if self.digits is None:
            train, test = self._load(train=True), self._load(train=False)
            self.digits = torch.cat([train.images, test.images])[:, 0]
            self.labels = torch.cat([train.targets, test.targets])
            self._validation_pool, self._train_pool = self.split_off_validation(torch.arange(len(train)))
            self._test_pool = torch.arange(len(train), len(self.digits))
        if stage in ("fit", "validate", None) and self.data_train is None:
            self.data_train = PairSpecs(self._train_pool.int()[:, None], self.labels[self._train_pool])
            self.data_val = self.fixed_pairs(self._validation_pool, split=0)
        if stage in ("test", None) and self.data_test is None:
            self.data_test = self.fixed_pairs(self._test_pool, split=1)

    def fixed_pairs(self, pool: torch.Tensor, split: int) -> PairSpecs:
        """``pairs_per_digit`` pairs with each digit of ``pool`` first, its partner from ``pool``."""
        generator = evaluation_generator(self.hparams.pair_seed, split)
        first = pool.repeat(self.hparams.pairs_per_digit)
        second = pool[partners(self.labels[first], generator, self.labels[pool])]
        shifts = random_shifts(len(first), self.hparams.shift, generator, first.device).flatten(1)
        specs = torch.cat([first[:, None], second[:, None], shifts], dim=1).int()
        return PairSpecs(specs, torch.stack([self.labels[first], self.labels[second]], dim=1))

    def _pools_on(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """The digits, their labels, and the training split's indices and labels on ``device``, copied once
        (training draws partners among the latter at every step)."""
        if str(device) not in self._on_device:
            pool = (self.digits, self.labels, self._train_pool, self.labels[self._train_pool])
            self._on_device[str(device)] = tuple(tensor.to(device) for tensor in pool)
        return self._on_device[str(device)]

    @property
    def image_conventions(self) -> ImageConventions:
        """MNIST's digits, one framed digit at the centre of the canvas (a person's image of one digit)."""
        return digit_conventions(self.hparams.canvas)

    def on_after_batch_transfer(self, batch: tuple[torch.Tensor, torch.Tensor], dataloader_idx: int) -> PairBatch:
        """Pair specs -> images, on the device; training batches draw their partners and shifts here."""
        specs, targets = batch
        digits, labels, train_pool, train_labels = self._pools_on(specs.device)
        first = specs[:, 0].long()
        if specs.shape[1] == 1:  # training: a partner from the training split, and shifts, for this step
            generator = self.augmentation_generator(specs.device)
            second = train_pool[partners(labels[first], generator, train_labels)]
            shifts = random_shifts(len(first), self.hparams.shift, generator, specs.device)
            targets = torch.stack([targets, labels[second]], dim=1)
        else:
            second, shifts = specs[:, 1].long(), specs[:, 2:].view(-1, 2, 2).long()
        images, components = compose(
            digits[first].float().div_(255), digits[second].float().div_(255), shifts, self.hparams.canvas
        )
        return PairBatch(images, targets, components)
