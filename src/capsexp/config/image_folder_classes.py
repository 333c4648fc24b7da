"""Where an image folder's classes are (torchvision's ``ImageFolder`` layout), without torch: the
config reads their number for the model's output layer (``${image_folder_classes:${data.root}}``),
:class:`capsexp.data.ImageFolderDataModule` their names."""

from __future__ import annotations

import os
from pathlib import Path

from capsexp.errors import DatasetNotFoundError


def class_folder(root: str | os.PathLike) -> Path:
    """The folder whose sub-folders are the classes: ``<root>/train`` where the root is split in advance,
    else the root."""
    root = Path(root).expanduser()
    return root / "train" if (root / "train").is_dir() else root


def class_names(root: str | os.PathLike) -> list[str]:
    """The classes of an image folder: its class sub-folders' names, sorted (as torchvision's ImageFolder
    numbers them). A :class:`DatasetNotFoundError` for a root that is not there or holds no class folder."""
    folder = class_folder(root)
    if not folder.is_dir():
        raise DatasetNotFoundError(
            f"data.root={root}: no such folder. An image folder holds one sub-folder of images per class "
            "(<root>/<class>/<image>), or train/ and test/ folders laid out so (docs/data.md)."
        )
    names = sorted(entry.name for entry in os.scandir(folder) if entry.is_dir() and not entry.name.startswith("."))
    if not names:
        raise DatasetNotFoundError(
            f"{folder}: no class folders in it. Put each class's images in a sub-folder named after the "
            "class (<root>/<class>/<image>)."
        )
    if len(names) == 1:  # a classifier of one class learns nothing (and torchmetrics refuses it)
        raise DatasetNotFoundError(
            f"{folder}: one class folder ({names[0]}); a classifier needs two classes at least, each a "
            "sub-folder of images named after the class (<root>/<class>/<image>)."
        )
    return names


def number_of_classes(root: str) -> int:
    """``${image_folder_classes:${data.root}}``: the number of classes, for the model's output layer."""
    return len(class_names(root))
