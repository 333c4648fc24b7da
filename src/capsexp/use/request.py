"""What a ``capsexp.predict`` command asks for, read without torch (it says what it found, or what is wrong,
before the model loads): its options, and the files ``images=`` names, every file of a folder either
predicted or named as skipped, with the reason."""

from __future__ import annotations

import glob
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capsexp.data.images import IMAGE_SUFFIXES
from capsexp.data.page import INVERT_OPTIONS
from capsexp.errors import ConfigError, ImageError

# How a person's image becomes the net's input: made as the dataset's images were (capsexp.data.conventions),
# or resized and centre-cropped alone.
FIT_OPTIONS = ("conventions", "plain")


@dataclass
class ImageFiles:
    """The image files to predict on, sorted; the folder they were found in (None for a file or a glob);
    and the files left out, each with the reason."""

    files: list[Path]
    root: Path | None = None
    skipped: list[tuple[Path, str]] = field(default_factory=list)


def image_files(images: str) -> ImageFiles:
    """The files ``images`` names: a file (taken whatever its ending), a folder searched recursively, or a
    glob. In a folder or a glob, hidden files and files whose ending is not an image's are skipped with
    the reason. :class:`~capsexp.errors.ImageError` when no image file is left."""
    path = Path(images).expanduser()
    if path.is_file():
        return ImageFiles([path])
    if path.is_dir():
        found, root, where = [p for p in path.rglob("*") if p.is_file()], path, "in this folder"
    elif glob.has_magic(images):
        found, root, where = [Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file()], None, ""
        if not found:
            raise ImageError(f"images={images}: the pattern matches no file")
    else:
        raise ImageError(f"images={images}: no such file or folder (give an image, a folder of images, or a glob)")
    files, skipped = [], []
    for file in sorted(found, key=str):
        reason = _skipped_because(file.relative_to(root) if root is not None else Path(file.name))
        if reason:
            skipped.append((file, reason))
        else:
            files.append(file)
    if not files:
        held = f"{len(skipped):,} files, none an image by its ending" if skipped else "no files at all"
        raise ImageError(
            f"images={images}: no image files {where} ({held}; image endings: {', '.join(IMAGE_SUFFIXES)})"
        )
    return ImageFiles(files, root, skipped)


def _skipped_because(file: Path) -> str | None:
    """Why a file found in a folder (``file``: its path below the folder) or by a glob is not an image to
    predict on; None when it is one. A notebook's ``.ipynb_checkpoints/`` copies are hidden files too."""
    if file.name.startswith("."):
        return "hidden file"
    if any(part.startswith(".") for part in file.parts[:-1]):
        return "in a hidden folder"
    if file.suffix.lower() not in IMAGE_SUFFIXES:
        return f"not an image by its ending ({file.suffix or 'none'})"
    return None


def folder_labels(files: Sequence[Path], class_names: Sequence[str]) -> list[int] | None:
    """Each file's class when every file sits in a folder named as one of the model's classes (an image
    folder with class sub-folders); else None."""
    index = {name: j for j, name in enumerate(class_names)}
    labels = [index.get(path.parent.name) for path in files]
    return None if any(label is None for label in labels) else labels


@dataclass(frozen=True)
class PredictOptions:
    """``capsexp.predict``'s options, checked (``conf/predict.yaml`` says what each does)."""

    top_k: int
    batch_size: int
    lines: float  # a number of images; math.inf for all
    explain: float
    fit: str
    invert: str | bool = "auto"


def predict_options(cfg: Any) -> PredictOptions:
    """The options of a ``capsexp.predict`` config; :class:`~capsexp.errors.ConfigError` naming a bad one."""
    if cfg.trainer.get("devices") not in (1, "1") or cfg.trainer.get("num_nodes", 1) != 1:
        raise ConfigError(
            f"trainer.devices={cfg.trainer.get('devices')}: predict runs on one device (its rows are written in "
            "order by one process); choose it with trainer.accelerator=cpu|gpu, trainer.devices=1"
        )
    fit = cfg.get("fit")
    if fit not in FIT_OPTIONS:
        raise ConfigError(f"fit={fit}: one of {', '.join(FIT_OPTIONS)}")
    invert = cfg.get("invert", "auto")
    if not isinstance(invert, bool) and str(invert).lower() not in INVERT_OPTIONS:
        raise ConfigError(
            f"invert={invert}: one of {', '.join(INVERT_OPTIONS)} (auto: each page's polarity decides; true: "
            "invert every image, dark ink on light paper; false: never)"
        )
    return PredictOptions(
        _positive(cfg, "top_k"),
        _positive(cfg, "batch_size"),
        _count(cfg, "lines"),
        _count(cfg, "explain"),
        fit,
        invert if isinstance(invert, bool) else str(invert).lower(),
    )


def _positive(cfg: Any, key: str) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key}={value}: must be a whole number of at least 1")
    return value


def _count(cfg: Any, key: str) -> float:
    """``lines`` / ``explain``: a number of images, ``all`` or true (every one), false (none)."""
    value = cfg.get(key)
    if value is True or value == "all":
        return math.inf
    if value is False or value is None:
        return 0
    if isinstance(value, int) and value >= 0:
        return value
    raise ConfigError(f"{key}={value}: give a number of images, all (or true), or false (none)")
