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


# ---- photos of paper: uneven light, shadows, tints, ruled lines, ink colours, sizes, JPEG and EXIF ----------------
LIT_PAGES = ((200, 200), (600, 400), (400, 600), (1000, 750))  # (width, height) of the photos
PAPERS = ((236, 236, 236), (246, 238, 214), (226, 234, 246), (214, 214, 208))  # white, cream, blue-tinted, grey
INKS = ((22, 22, 28), (28, 38, 128), (88, 88, 94), (128, 24, 30))  # black, blue pen, pencil, red pen
RULED = (150, 182, 232)  # a ruled line's light blue
LIGHTING = ("vignette", "spot", "falloff", "shadow")
VIGNETTE = 0.12  # the corners this much darker than the centre


def lighting(kind: str, width: int, height: int, rng: np.random.Generator) -> np.ndarray:
    """(height, width) float: the light falling on the page, 1 at its brightest. Every kind has the vignette
    (corners :data:`VIGNETTE` darker, as a phone's lens gives) times: nothing more; a spot (brighter near a
    random point, as a lamp or the phone's flash); a falloff (a linear gradient across the page, 15 to 40 %
    darker at its far side); a shadow (a half-plane 25 to 45 % darker, its edge 2 to 12 pixels soft)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    u, v = (x - width / 2) / (width / 2), (y - height / 2) / (height / 2)
    light = 1 - VIGNETTE * (u**2 + v**2) / 2
    if kind == "spot":
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        spread = rng.uniform(0.3, 0.6) * max(width, height)
        light *= 0.78 + 0.22 * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * spread**2))
    elif kind == "falloff":
        angle = rng.uniform(0, 2 * np.pi)
        along = (np.cos(angle) * u + np.sin(angle) * v + 1.5) / 3  # 0 to 1 across the page
        light *= 1 - rng.uniform(0.15, 0.4) * along
    elif kind == "shadow":
        angle = rng.uniform(0, 2 * np.pi)
        offset = rng.uniform(-0.6, 0.6)
        distance = (np.cos(angle) * (x - width / 2) + np.sin(angle) * (y - height / 2)) - offset * min(
            width, height
        ) / 2
        softness = rng.uniform(2, 12)
        light *= 1 - rng.uniform(0.25, 0.45) / (1 + np.exp(-distance / softness))
    return light / light.max()


def photographed(digit: np.ndarray, rng: np.random.Generator) -> tuple[Image.Image, dict]:
    """One 28x28 MNIST digit as a phone's photo of it written on paper: a page size of :data:`LIT_PAGES`, a
    paper of :data:`PAPERS` (ruled in light blue on a third of the pages), an ink of :data:`INKS`, the digit's
    field 12 to 80 % of the page's shorter side anywhere on it, lit by one of :data:`LIGHTING`, with sensor
    noise. The image (RGB, or grey for a fifth of them) and what was drawn."""
    width, height = LIT_PAGES[rng.integers(len(LIT_PAGES))]
    paper = np.array(PAPERS[rng.integers(len(PAPERS))], np.float64)
    ink = np.array(INKS[rng.integers(len(INKS))], np.float64)
    side = int(rng.uniform(0.12, 0.8) * min(width, height))
    x0, y0 = int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1))
    share = np.zeros((height, width))
    share[y0 : y0 + side, x0 : x0 + side] = (
        np.asarray(Image.fromarray(digit).resize((side, side), Image.BICUBIC), np.float64).clip(0, 255) / 255
    )
    page = np.broadcast_to(paper, (height, width, 3)).copy()
    ruled = rng.random() < 1 / 3
    if ruled:
        spacing = int(rng.uniform(0.06, 0.1) * height)
        rows = np.arange(int(rng.integers(0, spacing)), height, spacing)
        for thickness in range(1 + (height > 500)):
            page[np.clip(rows + thickness, 0, height - 1)] = RULED
    page = page * (1 - share[..., None]) + ink * share[..., None]
    kind = LIGHTING[rng.integers(len(LIGHTING))]
    page = page * lighting(kind, width, height, rng)[..., None] + rng.normal(0, 2.0, (height, width, 1))
    image = Image.fromarray(page.clip(0, 255).round().astype(np.uint8), "RGB")
    grey = rng.random() < 0.2
    return (image.convert("L") if grey else image), {
        "size": f"{width}x{height}",
        "lighting": kind,
        "ruled": ruled,
        "grey": grey,
        "side": side,
    }


def write_photographed(digits: np.ndarray, labels: np.ndarray, folder: Path, seed: int = 3) -> list[dict]:
    """Each digit photographed (:func:`photographed`) and saved as ``<folder>/<label>/<index>.jpg`` (JPEG
    quality 70 to 92; a quarter stored sideways with EXIF orientation 6 or 8, as a phone stores a photo taken
    turned), a tenth as PNG; what was drawn, per file."""
    rng = np.random.default_rng(seed)
    drawn = []
    for index, (digit, label) in enumerate(zip(digits, labels.tolist(), strict=True)):
        image, what = photographed(digit, rng)
        (folder / str(label)).mkdir(parents=True, exist_ok=True)
        exif = Image.Exif()
        if rng.random() < 0.25:
            orientation = int(rng.choice([6, 8]))
            exif[0x0112] = orientation  # 6: turn 90 degrees clockwise to show, 8: anticlockwise
            image = image.transpose(Image.Transpose.ROTATE_90 if orientation == 6 else Image.Transpose.ROTATE_270)
            what["exif"] = orientation
        if rng.random() < 0.1:
            path = folder / str(label) / f"{index:05d}.png"
            image.save(path, exif=exif)
        else:
            path = folder / str(label) / f"{index:05d}.jpg"
            image.save(path, quality=int(rng.integers(70, 93)), exif=exif)
        drawn.append({"file": str(path.relative_to(folder)), **what})
    return drawn


def write_blank_photos(folder: Path, count: int = 10, seed: int = 4) -> Path:
    """Photos of paper with nothing written on it, lit as :func:`photographed` lights pages."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    blank = np.zeros((28, 28), np.uint8)
    for index in range(count):
        image, _ = photographed(blank, rng)
        image.save(folder / f"blank_{index:02d}.jpg", quality=85)
    return folder
