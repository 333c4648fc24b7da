"""LightningDataModules and datasets."""

from capsexp.data.colour import CIFAR10DataModule, SVHNDataModule
from capsexp.data.image_folder import ImageFolderDataModule
from capsexp.data.mnist import FashionMNISTDataModule, MNISTDataModule
from capsexp.data.multi_mnist import MultiMNISTDataModule
from capsexp.data.smallnorb import SmallNORBDataModule
from capsexp.data.tensor_dataset import ImageTensorDataset

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
