"""MNIST test digits redrawn as people's files come: dark ink on light grey paper, anywhere on a larger page,
at sizes from small to filling it, saved as JPEG; and the files no digit is in (a blank page, noise), and a
phone's photo stored sideways with its EXIF orientation. Shared by ``bench_predict.py`` and the slow test
of ``tests/test_person_images.py``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageChops

PAGE = 200  # pixels a side of the page
SIDES = (40, 200)  # the drawn digit's side (MNIST's 28x28 field scaled), from small to filling the page
PAPER = 232  # the paper's grey
QUALITY = 85  # JPEG quality


def drawn(digit: np.ndarray, rng: np.random.Generator) -> Image.Image:
    """One 28x28 MNIST digit as a person's file: its field scaled to a side drawn from :data:`SIDES`, placed
    at random on the page, the ink darkening the paper."""
    side = int(rng.integers(SIDES[0], SIDES[1] + 1))
    x, y = (int(v) for v in rng.integers(0, PAGE - side + 1, size=2))
    ink = Image.new("L", (PAGE, PAGE), 255)
    ink.paste(Image.fromarray(255 - digit).resize((side, side), Image.BICUBIC), (x, y))
    return ImageChops.darker(Image.new("L", (PAGE, PAGE), PAPER), ink).convert("RGB")


def write_people_files(digits: np.ndarray, labels: np.ndarray, folder: Path, seed: int = 0) -> Path:
    """Each digit drawn (:func:`drawn`) and saved as ``<folder>/<label>/<index>.jpg``."""
    rng = np.random.default_rng(seed)
    for index, (digit, label) in enumerate(zip(digits, labels.tolist(), strict=True)):
        (folder / str(label)).mkdir(parents=True, exist_ok=True)
        drawn(digit, rng).save(folder / str(label) / f"{index:05d}.jpg", quality=QUALITY)
    return folder


def write_pngs(digits: np.ndarray, labels: np.ndarray, folder: Path) -> Path:
    """The digits as they are, 28x28 grey PNGs in class folders."""
    for index, (digit, label) in enumerate(zip(digits, labels.tolist(), strict=True)):
        (folder / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(digit).save(folder / str(label) / f"{index:05d}.png")
    return folder


def write_sideways(digits: np.ndarray, labels: np.ndarray, folder: Path, seed: int = 1) -> tuple[Path, Path]:
    """Each digit drawn, saved twice: upright, and as a phone stores a photo taken turned (pixels rotated,
    EXIF orientation 6 saying to turn them back). The two folders."""
    rng = np.random.default_rng(seed)
    upright, sideways = folder / "upright", folder / "sideways"
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to show
    for index, (digit, label) in enumerate(zip(digits, labels.tolist(), strict=True)):
        image = drawn(digit, rng)
        for root in (upright, sideways):
            (root / str(label)).mkdir(parents=True, exist_ok=True)
        image.save(upright / str(label) / f"{index:05d}.jpg", quality=QUALITY)
        image.transpose(Image.Transpose.ROTATE_90).save(
            sideways / str(label) / f"{index:05d}.jpg", quality=QUALITY, exif=exif
        )
    return upright, sideways


def write_no_digit(folder: Path, count: int = 20, seed: int = 2) -> Path:
    """Files no digit is in: blank pages (paper, with JPEG noise) and images of random pixels."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        if index % 2:
            pixels = rng.integers(0, 256, size=(PAGE, PAGE), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"noise_{index:02d}.png")
        else:
            Image.new("RGB", (PAGE, PAGE), (PAPER,) * 3).save(folder / f"blank_{index:02d}.jpg", quality=QUALITY)
    return folder
