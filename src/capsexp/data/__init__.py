"""LightningDataModules and datasets.

The classes are imported when first named (``capsexp.data.MNISTDataModule``, as configs' ``_target_``
name them), so that the light modules of this package (image decoding, the image conventions) load
without Lightning.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from capsexp.data.colour import CIFAR10DataModule, SVHNDataModule
    from capsexp.data.image_folder import ImageFolderDataModule
    from capsexp.data.mnist import FashionMNISTDataModule, MNISTDataModule
    from capsexp.data.multi_mnist import MultiMNISTDataModule
    from capsexp.data.smallnorb import SmallNORBDataModule
    from capsexp.data.tensor_dataset import ImageTensorDataset

_HOMES = {
    "CIFAR10DataModule": "colour",
    "SVHNDataModule": "colour",
    "ImageFolderDataModule": "image_folder",
    "FashionMNISTDataModule": "mnist",
    "MNISTDataModule": "mnist",
    "MultiMNISTDataModule": "multi_mnist",
    "SmallNORBDataModule": "smallnorb",
    "ImageTensorDataset": "tensor_dataset",
}
__all__ = [
    "CIFAR10DataModule",
    "FashionMNISTDataModule",
    "ImageFolderDataModule",
    "ImageTensorDataset",
    "MNISTDataModule",
    "MultiMNISTDataModule",
    "SVHNDataModule",
    "SmallNORBDataModule",
]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"capsexp.data.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'capsexp.data' has no attribute {name!r}")
