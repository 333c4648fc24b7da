"""Batches drawn from a dataset that lives on the accelerator.

On a GPU, a DataLoader gathers each batch on the CPU and copies it over: for LeNet5 or CapsNet on
MNIST that per-step work, not the arithmetic, bounds the speed. Here the whole set is copied to the
device once; each epoch the sampler's indices are drawn on the CPU (the same samplers as the
DataLoader path: shuffled, sharded per process under DDP, evaluation shards without repeats) and
copied in one transfer; each batch is then a single gather on the device.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class DeviceBatchLoader:
    """Iterate over ``(images, targets)`` batches of tensors held on ``images.device``.

    Args:
        images, targets: the whole set, already on the device.
        batch_size: batch size of this process.
        sampler: where the order comes from (e.g. ``DistributedSampler``); ``None``: the stored order.
    """

    def __init__(
        self,
        images: torch.Tensor,
        targets: torch.Tensor,
        batch_size: int,
        sampler: Sampler | None = None,
    ) -> None:
        if len(images) != len(targets):
            raise ValueError(f"{len(images)} images but {len(targets)} targets")
        self.images, self.targets = images, targets
        self.batch_size = batch_size
        # Lightning calls sampler.set_epoch(epoch) through these attributes, as for a DataLoader.
        self.sampler = sampler
        self.batch_sampler = None

    def _count(self) -> int:
        return len(self.sampler) if self.sampler is not None else len(self.images)

    def __len__(self) -> int:
        return math.ceil(self._count() / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        device = self.images.device
        order = torch.as_tensor(list(self.sampler), dtype=torch.long) if self.sampler is not None else None
        if order is None:  # the stored order: slices, no gather
            for start in range(0, len(self.images), self.batch_size):
                yield self.images[start : start + self.batch_size], self.targets[start : start + self.batch_size]
            return
        order = order.to(device, non_blocking=True)
        for start in range(0, len(order), self.batch_size):
            index = order[start : start + self.batch_size]
            yield self.images.index_select(0, index), self.targets.index_select(0, index)
