"""An in-memory image dataset that hands whole batches to the DataLoader."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.data import Dataset


class ImageTensorDataset(Dataset):
    """Images (N, C, H, W) and integer targets (N,) held as tensors.

    ``__getitems__`` gathers a whole batch with one indexing operation instead of ``batch_size``
    ``__getitem__`` calls and a stack: use it with :func:`collate_batch`. Images stay uint8 until they
    reach the device (see the DataModules' ``on_after_batch_transfer``), which moves 4x fewer bytes.
    """

    def __init__(
        self, images: torch.Tensor, targets: torch.Tensor, extras: dict[str, torch.Tensor] | None = None
    ) -> None:
        if images.ndim != 4:
            raise ValueError(f"images must have shape (N, C, H, W), got {tuple(images.shape)}")
        if len(images) != len(targets):
            raise ValueError(f"{len(images)} images but {len(targets)} targets")
        self.images = images
        self.targets = targets.long()
        # Per-sample metadata kept beside the batches (smallNORB's instance, elevation, ...).
        self.extras = extras or {}

    @property
    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """What a batch is gathered from, in batch order (a copy is kept on the device for data.on_device)."""
        return self.images, self.targets

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.targets[index]

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(indices, dtype=torch.long)
        return self.images[index], self.targets[index]

    def subset(self, indices: torch.Tensor) -> ImageTensorDataset:
        """A dataset holding only ``indices`` (copies the selected rows once)."""
        return ImageTensorDataset(
            self.images[indices], self.targets[indices], {name: values[indices] for name, values in self.extras.items()}
        )


def collate_batch(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Collate function for :class:`ImageTensorDataset`: ``__getitems__`` already built the batch."""
    return batch
