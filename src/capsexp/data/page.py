"""A person's image made the input of a net trained on MNIST-like data, with NumPy and Pillow alone.

capsexp runs this module for every image it predicts on (:func:`capsexp.data.conventions.fit`), and
writes this file beside an exported model as ``prepare.py``: there it reads the parameters from the
``preprocessing`` entry of the ``model.json`` beside it (their one home is
:data:`capsexp.data.conventions.PAGE`), so that a script without capsexp makes the same input::

    python prepare.py model.json photo.jpg [more images] [--invert auto|true|false] [--output inputs.npy]

or, from Python, ``prepare.prepare(path_or_pillow_image, json.load(open("model.json"))["preprocessing"])``:
a (C, S, S) uint8 array, the exported graph's ``images`` input for one image (stack them for a batch).

What it does (``docs/predict.md#how-an-image-reaches-the-model``):

1. decoding: the EXIF orientation applied, wide grey scaled to 8 bits, transparency on white, then grey
   (ITU-R 601-2 luma) or RGB;
2. the paper's lighting: estimated as a large-scale background on a coarse grid of the page (box
   averages, ``background_grid`` cells on the longer side, or the page itself where smaller) and divided
   out, the filters' window ``background_filter`` of the grid's longer side (odd, at least 3 cells; edges
   replicated). Polarity is read on the page flattened by a median (``polarity_filter`` of a coarser grid,
   ``polarity_grid`` cells: wide, so that a large digit's strokes do not make its ground): dark ink where
   the pixels darker than that background by more than ``faintest_ink`` outweigh the lighter ones. The ink is then
   read against a morphological closing of the grid (dilation by the window, erosion by the window and
   ``background_margin`` cells more on each side: strokes narrower than the filter are filled with paper,
   and the wider erosion keeps a shadow's edge from reading as ink), brought back to the page's size
   (bilinear) and divided out: ink = 1 - page / paper. Light ink on a dark ground: the opening instead,
   and ink = (page - ground) / 255. Where that finds no ink (a bold blob as wide as the filter, which the
   closing keeps as paper), the ink is read against the polarity's median background instead;
3. framing as MNIST's digits: a page whose ink nowhere reaches ``faintest_ink`` is blank; else the ink
   scaled so its brightest is 1, ink within ``ground_level`` of the way made ground, the bounding box of
   the ink above ``ink_level`` scaled to ``digit_box`` pixels on its longer side (Pillow's bilinear on
   float pixels, antialiased), placed by its centre of mass at the centre of a ``digit`` x ``digit``
   field, on the centre of the ``size`` canvas where larger.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from PIL import ExifTags, Image, ImageOps

NO_INK = "no ink found"  # how a blank page's note begins: the per-image line and the figure say it
INVERTED = "inverted"
INVERT_OPTIONS = ("auto", "true", "false")
_WIDE_GREY = ("I", "I;16", "I;16B", "I;16L", "I;16N", "F")  # 16-bit, 32-bit and float grey


# ---- decoding ------------------------------------------------------------------------------------------------
def decode(image: Image.Image, mode: str) -> tuple[np.ndarray, list[str]]:
    """(C, H, W) uint8 of a Pillow image in ``mode`` (``L`` or ``RGB``), and a note for each thing done
    (see the module's docstring)."""
    notes, found = [], image.mode
    orientation = image.getexif().get(ExifTags.Base.Orientation, 1)
    if orientation != 1:  # (exif_transpose copies even an upright image)
        image = ImageOps.exif_transpose(image)
        notes.append(f"turned upright by its EXIF orientation ({orientation})")
    if image.mode in _WIDE_GREY:
        values = np.asarray(image, dtype=np.float64)
        top = 65535.0 if image.mode.startswith("I;16") else max(float(values.max()), 1.0)
        image = Image.fromarray(np.clip(values * (255.0 / top), 0, 255).round().astype(np.uint8), "L")
        notes.append(f"{found} pixels scaled to 8 bits")
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        ground = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(ground, image.convert("RGBA")).convert("RGB")
        notes.append("transparent pixels put on white")
    if image.mode not in ("L", "RGB", "1"):  # palette, CMYK, YCbCr, ...: their colours first
        image = image.convert("RGB")
    grey = found in ("1", "L", "LA", *_WIDE_GREY)  # a palette image (P) counts as colour
    if mode == "L" and not grey:
        notes.append("RGB converted to grey (ITU-R 601-2 luma), as the model's training images")
    elif mode == "RGB" and grey:
        notes.append("grey converted to RGB, as the model's training images")
    pixels = np.array(image if image.mode == mode else image.convert(mode), dtype=np.uint8)
    return (pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1).copy()), notes


# ---- the paper's lighting ------------------------------------------------------------------------------------
def grey_of(pixels: np.ndarray) -> np.ndarray:
    """(C, H, W) uint8 -> (H, W) float32, the channels' mean."""
    return pixels[0].astype(np.float32) if len(pixels) == 1 else pixels.mean(axis=0, dtype=np.float32)


def _grid(grey: np.ndarray, cells: int) -> np.ndarray:
    """The page on a grid of ``cells`` on its longer side (box averages); the page itself where smaller."""
    height, width = grey.shape
    scale = cells / max(height, width)
    if scale >= 1:
        return grey
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return np.asarray(Image.fromarray(grey, "F").resize(size, Image.Resampling.BOX))


def _page_sized(grid: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    if grid.shape == shape:
        return grid
    return np.asarray(Image.fromarray(grid, "F").resize((shape[1], shape[0]), Image.Resampling.BILINEAR))


def _windows(values: np.ndarray, size: int, axes: tuple[int, ...]) -> np.ndarray:
    """Every ``size``-wide window along ``axes``, the edges replicated (the output keeps the input's shape)."""
    pad = [(size // 2, size - 1 - size // 2) if axis in axes else (0, 0) for axis in range(values.ndim)]
    shape = tuple(size if axis in axes else 1 for axis in range(values.ndim))
    return np.lib.stride_tricks.sliding_window_view(np.pad(values, pad, mode="edge"), shape)


def _rank(values: np.ndarray, size: int, reduce) -> np.ndarray:
    """A square window's maximum or minimum, separably (rows, then columns)."""
    for axis in (0, 1):
        values = reduce(_windows(values, size, (axis,)), axis=(-2, -1))
    return values


def _window(grid: np.ndarray, share: float) -> int:
    """A filter's window on ``grid``: ``share`` of its longer side, odd, at least 3 cells."""
    return max(3, 2 * round(share * max(grid.shape) / 2) + 1)


def _median(values: np.ndarray, size: int) -> np.ndarray:
    windows = _windows(values, size, (0, 1)).reshape(*values.shape, -1)
    middle = windows.shape[-1] // 2  # an odd window: its middle value is the median
    return np.partition(windows, middle, axis=-1)[..., middle]


def median_ground(grey: np.ndarray, params: dict) -> np.ndarray:
    """(H, W) float32: the page's ground as a median of a coarse grid (see the module's docstring)."""
    grid = _grid(grey, params["polarity_grid"])
    return _page_sized(_median(grid, _window(grid, params["polarity_filter"])), grey.shape)


def dark_ink(grey: np.ndarray, params: dict) -> bool:
    """Whether the page's ink is darker than its ground, read on the page flattened by a median background
    (see the module's docstring)."""
    flat = grey - median_ground(grey, params)
    faint = 255 * params["faintest_ink"]
    return float(np.clip(-flat - faint, 0, None).sum()) > float(np.clip(flat - faint, 0, None).sum())


def ink_of(grey: np.ndarray, dark: bool, params: dict) -> np.ndarray:
    """(H, W) float32: how much ink each pixel holds, the paper's lighting divided out (see the module's
    docstring): the share of the paper's brightness it takes away (dark ink), or of full white it adds."""
    grid = _grid(grey, params["background_grid"])
    size = _window(grid, params["background_filter"])
    wider = size + 2 * params["background_margin"]
    if dark:
        paper = _page_sized(_rank(_rank(grid, size, np.max), wider, np.min), grey.shape)
    else:
        paper = _page_sized(_rank(_rank(grid, size, np.min), wider, np.max), grey.shape)
    ink = _against(grey, paper, dark)
    if ink.max() < params["faintest_ink"]:
        # Ink as wide as the filter (a bold blob filling a tight crop) is kept by the closing as paper:
        # read it against the median ground instead, which a shape covering less than half its window
        # does not move.
        ink = _against(grey, median_ground(grey, params), dark)
    return ink


def _against(grey: np.ndarray, paper: np.ndarray, dark: bool) -> np.ndarray:
    if dark:
        return np.clip(1 - grey / np.maximum(paper, 1), 0, None)
    return np.clip((grey - paper) / 255, 0, None)


# ---- framing -------------------------------------------------------------------------------------------------
def frame(ink: np.ndarray, params: dict) -> tuple[np.ndarray | None, str]:
    """(field, field) float32 in [0, 1]: the ink framed as MNIST's digits (see the module's docstring), and a
    note; None for a blank page."""
    box, field = params["digit_box"], params["digit"]
    peak = float(ink.max())
    if peak < params["faintest_ink"]:
        return None, f"{NO_INK} (a blank page): given to the model as an empty {field}x{field} image"
    ground = params["ground_level"]
    ink = np.clip((ink / peak - ground) / (1 - ground), 0, 1).astype(np.float32)
    inked = ink > params["ink_level"]
    rows, columns = np.flatnonzero(inked.any(axis=1)), np.flatnonzero(inked.any(axis=0))
    top, bottom, left, right = int(rows[0]), int(rows[-1]) + 1, int(columns[0]), int(columns[-1]) + 1
    crop = np.ascontiguousarray(ink[top:bottom, left:right])
    scale = box / max(crop.shape)
    height, width = (max(1, round(side * scale)) for side in crop.shape)
    scaled = np.clip(np.asarray(Image.fromarray(crop, "F").resize((width, height), Image.Resampling.BILINEAR)), 0, 1)
    weight = float(scaled.sum())
    # The centre of mass in pixel indices, placed at index field / 2 (MNIST's mean is (14.0, 14.0) in 28).
    centre_y = float((scaled.sum(axis=1) * np.arange(height)).sum()) / weight
    centre_x = float((scaled.sum(axis=0) * np.arange(width)).sum()) / weight
    y, x = round(field / 2 - centre_y), round(field / 2 - centre_x)
    framed = np.zeros((field, field), np.float32)
    # Clipped where the centre of mass lies so far off the box's centre that the box leaves the field.
    y0, x0, y1, x1 = max(y, 0), max(x, 0), min(y + height, field), min(x + width, field)
    framed[y0:y1, x0:x1] = scaled[y0 - y : y1 - y, x0 - x : x1 - x]
    return framed, (
        f"framed as MNIST's digits: the ink's {bottom - top}x{right - left} box scaled to {box} pixels "
        f"on its longer side, centred by its mass in {field}x{field}"
    )


def invert_choice(invert: str | bool | None) -> bool | None:
    """``invert`` as given (``auto``, ``true``, ``false``, or a bool; None is auto) -> None (auto), True, False.
    ValueError naming what is allowed."""
    if invert is None or isinstance(invert, bool):
        return invert
    if str(invert).lower() not in INVERT_OPTIONS:
        raise ValueError(f"invert={invert}: one of {', '.join(INVERT_OPTIONS)}")
    return {"auto": None, "true": True, "false": False}[str(invert).lower()]


def fit_page(
    pixels: np.ndarray, params: dict, square, invert: str | bool | None = "auto"
) -> tuple[np.ndarray, list[str]]:
    """A (C, H, W) uint8 page made as the dataset made its images (``params``: the conventions'
    ``as_dict()``; ``square(pixels, size)``: the resize and centre crop for data not framed as digits), and a
    note for each thing done. ``invert``: ``auto`` (the page's polarity decides, for light-ink data), or
    ``true`` / ``false`` (the user's word, for any data)."""
    forced = invert_choice(invert)
    size, field, notes = params["size"], params["digit"], []
    official = params.get("official_size")
    if official not in (None, size) and tuple(pixels.shape[-2:]) == (official, official):
        pixels = downsampled(pixels, size)
        notes.append(downsampled_note(official, size))
    grey = grey_of(pixels)
    dark = forced if forced is not None else bool(params["light_ink"]) and dark_ink(grey, params)
    if dark:
        why = (
            "invert=true"
            if forced
            else "dark ink on a light ground, where the model's training images are light on dark"
        )
        notes.append(f"{INVERTED}: {why}")
    shape = tuple(pixels.shape[-2:])
    if shape == (size, size):
        return (255 - pixels if dark else pixels), notes
    if params["digit_box"] is None:
        return square(255 - pixels if dark else pixels, size), [
            *notes,
            f"resized (shorter side to {size}, centre crop)",
        ]
    if shape != (field, field):
        framed, note = frame(ink_of(grey, dark, params), params)
        notes.append(note)
        digit = np.zeros((field, field), np.float32) if framed is None else framed
        digit = np.broadcast_to(np.round(digit * 255).astype(np.uint8), (len(pixels), field, field))
    else:
        digit = 255 - pixels if dark else pixels
    if size != field:
        top = (size - field) // 2
        digit = np.pad(digit, ((0, 0), (top, size - field - top), (top, size - field - top)))
        notes.append(f"placed at the centre of the {size}x{size} canvas")
    return np.ascontiguousarray(digit), notes


def downsampled_note(official: int, size: int) -> str:
    return f"downsampled {official} -> {size} by area averaging, as the dataset's images"


def downsampled(pixels: np.ndarray, size: int) -> np.ndarray:
    """(C, H, W) uint8 -> (C, size, size) by area averaging (Pillow's box filter on float pixels), rounded:
    the dataset's own downsampling where ``size`` divides the side (96 -> 48: 2x2 blocks)."""
    channels = [
        np.asarray(Image.fromarray(c.astype(np.float32), "F").resize((size, size), Image.Resampling.BOX))
        for c in pixels
    ]
    return np.round(np.stack(channels)).astype(np.uint8)


def square(pixels: np.ndarray, size: int) -> np.ndarray:
    """(C, H, W) uint8 -> (C, size, size): the shorter side resized to ``size`` (Pillow's antialiased
    bilinear), then the centre crop. capsexp itself resizes with torchvision's antialiased bilinear, which
    may differ from this by a grey level; the MNIST framing above is capsexp's own code."""
    height, width = pixels.shape[-2:]
    scale = size / min(height, width)
    new = (max(size, round(width * scale)), max(size, round(height * scale)))
    channels = [np.asarray(Image.fromarray(c).resize(new, Image.Resampling.BILINEAR)) for c in pixels]
    top, left = (new[1] - size) // 2, (new[0] - size) // 2
    return np.stack(channels)[:, top : top + size, left : left + size].copy()


def prepare(source, params: dict, invert: str | bool | None = "auto") -> tuple[np.ndarray, list[str]]:
    """An image file or a Pillow image -> (C, S, S) uint8, the exported model's input for it, and the notes."""
    mode = "RGB" if params.get("channels", 1) == 3 else "L"
    if isinstance(source, Image.Image):
        pixels, notes = decode(source, mode)
    else:
        with Image.open(source) as opened:
            pixels, notes = decode(opened, mode)
    if params.get("channels") == 2 and len(pixels) == 1:
        pixels = np.concatenate([pixels, pixels])
        notes.append("used as both views of the stereo pair")
    fitted, fitting = fit_page(pixels, params, square, invert)
    return fitted, notes + fitting


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Images as the exported model's input (see this file's docstring).")
    parser.add_argument("model_json", type=Path)
    parser.add_argument("images", nargs="+", type=Path)
    parser.add_argument("--invert", default="auto", choices=INVERT_OPTIONS)
    parser.add_argument("--output", type=Path, default=Path("inputs.npy"))
    args = parser.parse_args(argv)
    params = json.loads(args.model_json.read_text())["preprocessing"]
    batch = []
    for path in args.images:
        pixels, notes = prepare(path, params, args.invert)
        batch.append(pixels)
        print(f"{path}: {'; '.join(notes) or 'used as it is'}")
    np.save(args.output, np.stack(batch))
    print(f"{args.output}: {len(batch)} images, (N, C, S, S) uint8")


if __name__ == "__main__":
    main(sys.argv[1:])
