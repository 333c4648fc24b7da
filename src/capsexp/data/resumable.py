"""Training data that resumes exactly: the same batches, in the same order, after a restart.

Each epoch's order is a function of the run's seed and the epoch alone (:class:`EpochSampler`), so
nothing random has to be saved; the loaders count the images they handed out this epoch and report
it in their ``state_dict``, which Lightning stores in the checkpoint and gives back on resume
(its ``_Stateful`` protocol). The restored epoch then starts where the saved one stood. Random
augmentation draws from :func:`step_generator`, seeded by the run's seed, the step and the process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from capsexp.data.device_loader import DeviceBatchLoader


def run_seed() -> int:
    """The run's seed as Lightning's ``seed_everything`` published it (0 without one)."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


class EpochSampler(DistributedSampler):
    """The training order: a permutation drawn from the run's seed and the epoch (Lightning calls
    ``set_epoch``), this process's share of it under DDP (as the sampler Lightning injects), and,
    after :meth:`start_at`, the restored epoch begins part way through its order."""

    def __init__(self, dataset: Dataset, num_replicas: int = 1, rank: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=run_seed())
        self._resume: tuple[int, int] | None = None  # (epoch, indices to skip)
        self.skipped = 0  # indices the current pass left out

    def start_at(self, epoch: int, skip: int) -> None:
        """Make the next pass over ``epoch`` leave out its first ``skip`` indices."""
        self._resume = (epoch, skip)

    def __iter__(self) -> Iterator[int]:
        indices = super().__iter__()
        resume, self._resume = self._resume, None
        self.skipped = resume[1] if resume is not None and resume[0] == self.epoch else 0
        return iter(list(indices)[self.skipped :]) if self.skipped else indices


class BatchCounter:
    """What the resumable loaders share: the images handed out in the current pass, as
    ``state_dict``, and a sampler told where to start again by ``load_state_dict``."""

    sampler: EpochSampler
    batch_size: int

    def _counted(self, batches: Iterator[Any]) -> Iterator[Any]:
        self._batches_this_epoch = 0
        for batch in batches:
            self._batches_this_epoch += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        # Counted in images, not batches: a run resumed with another batch size goes on from the same image.
        # A resumed pass began after the images its epoch had already handed out: they count too, or a
        # second stop in the same epoch would resume too early and repeat batches.
        handed_out = getattr(self, "_batches_this_epoch", 0) * self.batch_size
        return {"epoch": self.sampler.epoch, "images": self.sampler.skipped + handed_out}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.sampler.set_epoch(state["epoch"])
        self.sampler.start_at(state["epoch"], state["images"])


class ResumableDataLoader(BatchCounter, DataLoader):
    """A training DataLoader over an :class:`EpochSampler` whose position survives a checkpoint."""

    def __init__(self, dataset: Dataset, sampler: EpochSampler, batch_size: int, **kwargs: Any) -> None:
        # Its own generator for the workers' base seed; else each pass draws one from the global
        # generator, and a resumed run's draws (dropout) would be shifted by it.
        generator = torch.Generator().manual_seed(run_seed())
        super().__init__(dataset, sampler=sampler, batch_size=batch_size, generator=generator, **kwargs)

    def __iter__(self) -> Iterator[Any]:
        return self._counted(super().__iter__())


class ResumableDeviceBatchLoader(BatchCounter, DeviceBatchLoader):
    """A training :class:`DeviceBatchLoader` over an :class:`EpochSampler` whose position survives a
    checkpoint."""

    def __init__(self, images: torch.Tensor, targets: torch.Tensor, batch_size: int, sampler: EpochSampler) -> None:
        super().__init__(images, targets, batch_size, sampler=sampler)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self._counted(super().__iter__())


def step_generator(device: torch.device, step: int, rank: int = 0) -> torch.Generator:
    """A generator for the random augmentation of one training step, seeded by the run's seed, the
    step and the process: a resumed run draws what the uninterrupted one drew."""
    seed = hash((run_seed(), step, rank)) & ((1 << 63) - 1)  # ints hash alike in every process
    return torch.Generator(device=device).manual_seed(seed)
