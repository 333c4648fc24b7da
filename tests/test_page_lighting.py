"""A photo of a page becomes an MNIST-framed digit whatever its lighting: the paper's lighting is taken out
before the polarity and the ink's box are decided; ``invert=auto|true|false``; a page without ink says so
on its line and in its figure; ``read()`` names its fields; an exported model carries the conventions'
parameters in ``model.json`` and a ``prepare.py`` (NumPy and Pillow alone) that makes the same input."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from capsexp.data import conventions
from capsexp.data.conventions import fit
from capsexp.data.mnist import digit_conventions
from capsexp.errors import ConfigError
from capsexp.use.request import predict_options

MNIST = digit_conventions(28)
HEIGHT, WIDTH = 150, 200
# The digit: an L of dark ink, rows 40 to 109 and columns 120 to 149 (a 70x30 box), its strokes 8 wide.
TOP, BOTTOM, LEFT, RIGHT = 40, 110, 120, 150


def vignetted(paper: float = 200.0) -> np.ndarray:
    """(H, W) float: paper lit as a phone lights it, brightest near (30, 40) (a lamp above the top left),
    falling off to 12% darker at the far corner."""
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float64)
    distance = np.hypot(y - 30, x - 40) / np.hypot(HEIGHT - 30, WIDTH - 40)
    return paper * (1 - 0.12 * distance**2) * (1 + 0.25 * np.exp(-(distance**2) / 0.05))


def with_digit(light: np.ndarray, ink: float = 0.1) -> np.ndarray:
    """The L written on the lit paper (ink reflects ``ink`` of the light), as uint8."""
    share = np.ones_like(light)
    share[TOP:BOTTOM, LEFT : LEFT + 8] = ink  # the upright
    share[BOTTOM - 8 : BOTTOM, LEFT:RIGHT] = ink  # the foot
    return np.clip(light * share, 0, 255).round().astype(np.uint8)


def old_polarity_test(page: np.ndarray) -> bool:
    """The rule the lighting defeats: the border's median (its outer tenth) lighter than the image's mean."""
    band = round(0.1 * min(page.shape))
    border = np.concatenate(
        [page[:band].ravel(), page[-band:].ravel(), page[:, :band].ravel(), page[:, -band:].ravel()]
    )
    return float(np.median(border)) > float(page.mean())


def box_note(height: int, width: int) -> str:
    return (
        f"framed as MNIST's digits: the ink's {height}x{width} box scaled to 20 pixels on its longer side, "
        "centred by its mass in 28x28"
    )


def test_a_vignetted_page_with_a_bright_spot_is_inverted_and_its_digit_framed():
    page = with_digit(vignetted())
    assert not old_polarity_test(page)  # the border is darker than the page on average: read as not inverted
    made, notes = fit(torch.from_numpy(page)[None], MNIST)
    assert notes[0].startswith("inverted: dark ink on a light ground")
    assert notes[1] == box_note(BOTTOM - TOP, RIGHT - LEFT)
    # The framed L: 20 high and 9 (30 * 20 / 70, rounded) wide, its foot at the bottom; the rest dark.
    ink = made[0].numpy() > 128
    rows, columns = np.nonzero(ink)
    assert rows.max() - rows.min() + 1 == 20 and columns.max() - columns.min() + 1 in (8, 9, 10)
    assert ink[rows.max()].sum() >= 7 and ink[rows.min()].sum() <= 3


def test_a_shadow_across_the_page_is_not_read_as_ink():
    """Half the page 40% darker, its edge 3 pixels soft, the digit in the lit half: the box is the digit's."""
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float64)
    light = 228 * (1 - 0.4 / (1 + np.exp(-(60 - x + 0.3 * y) / 3)))  # the shadow on the left
    _, notes = fit(torch.from_numpy(with_digit(light))[None], MNIST)
    assert notes == [notes[0], box_note(BOTTOM - TOP, RIGHT - LEFT)] and notes[0].startswith("inverted")


def test_tinted_ruled_paper_and_blue_ink_frame_the_digit_and_a_blank_ruled_page_is_blank():
    """Cream paper ruled in light blue every 14 rows, the L in blue pen, RGB read as grey (luma)."""
    rgb = np.ones((HEIGHT, WIDTH, 3)) * (246, 238, 214)
    rgb[3::14] = (170, 200, 240)
    blank = Image.fromarray(rgb.astype(np.uint8)).convert("L")
    written = with_digit(np.full((HEIGHT, WIDTH), 255.0), ink=0) == 0
    page = Image.fromarray(np.where(written[..., None], (28, 38, 128), rgb).astype(np.uint8)).convert("L")
    _, notes = fit(torch.from_numpy(np.array(page))[None], MNIST)
    assert notes[1] == box_note(BOTTOM - TOP, RIGHT - LEFT)
    made, notes = fit(torch.from_numpy(np.array(blank))[None], MNIST)
    assert notes[-1].startswith("no ink found (a blank page)") and made.max() == 0


def test_a_bold_blob_wider_than_the_lighting_filter_is_still_ink():
    """A 30x14 block of dark ink filling a tight 50x40 crop: the closing keeps it as paper, the median
    ground does not, so its box is framed (not a blank page)."""
    crop = np.full((50, 40), 220, np.uint8)
    crop[12:42, 20:34] = 30
    made, notes = fit(torch.from_numpy(crop)[None], MNIST)
    assert notes == [
        "inverted: dark ink on a light ground, where the model's training images are light on dark",
        box_note(30, 14),
    ]
    rows, columns = np.nonzero(made[0].numpy() > 128)
    assert rows.max() - rows.min() + 1 == 20 and columns.max() - columns.min() + 1 in (9, 10)


def test_invert_true_and_false_decide_the_polarity_and_another_value_is_refused():
    light_on_dark = torch.zeros(1, 28, 28, dtype=torch.uint8)
    light_on_dark[0, 5:23, 13:16] = 250
    made, notes = fit(light_on_dark, MNIST, invert="true")
    assert torch.equal(made, 255 - light_on_dark) and notes == ["inverted: invert=true"]
    dark_on_light = 255 - light_on_dark
    assert fit(dark_on_light, MNIST)[1][0].startswith("inverted")  # auto
    made, notes = fit(dark_on_light, MNIST, invert=False)
    assert torch.equal(made, dark_on_light) and notes == []
    with pytest.raises(ValueError, match="invert=maybe: one of auto, true, false"):
        fit(dark_on_light, MNIST, invert="maybe")


def test_predicts_invert_option_is_checked_before_the_model_loads():
    from capsexp.config.hydra_setup import compose

    for given, expected in (("auto", "auto"), ("true", True), ("false", False)):
        assert predict_options(compose(["ckpt_path=x", "images=y", f"invert={given}"], "predict")).invert == expected
    with pytest.raises(ConfigError, match="invert=upside: one of auto, true, false"):
        predict_options(compose(["ckpt_path=x", "images=y", "invert=upside"], "predict"))


@pytest.fixture(scope="module")
def lenet5(tmp_path_factory):
    """LeNet5 on MNIST as capsexp.load gives it (weights untrained: the input is what is tested)."""
    from capsexp.config.instantiation import build_model, instantiate
    from capsexp.use.inference import TrainedModel
    from tests.helpers import compose_config

    root = tmp_path_factory.mktemp("lenet5")
    cfg = compose_config(["model=lenet5", "data=mnist", f"paths.data_dir={root}"], root)
    return TrainedModel(
        build_model("model", cfg.model), instantiate("data", cfg.data, _convert_="all"), cfg, root, None
    )


def test_read_gives_the_pixels_the_notes_and_whether_ink_was_found(lenet5, tmp_path):
    Image.fromarray(with_digit(vignetted())).save(tmp_path / "digit.png")
    Image.fromarray(np.full((40, 60), 200, np.uint8)).save(tmp_path / "blank.png")
    read = lenet5.read(tmp_path / "digit.png")
    assert read.pixels.shape == (1, 28, 28) and read.pixels.dtype == torch.uint8 and read.ink_found
    assert read.notes[1] == box_note(BOTTOM - TOP, RIGHT - LEFT) and read._fields == ("pixels", "notes")
    blank = lenet5.read(tmp_path / "blank.png")
    assert not blank.ink_found and blank.pixels.max() == 0
    assert not any(note.startswith("inverted") for note in lenet5.read(tmp_path / "digit.png", invert="false").notes)
    with pytest.raises(ConfigError, match="invert=2: one of auto, true, false"):
        lenet5.predict(tmp_path / "digit.png", invert=2)


def peoples_files(folder: Path) -> list[Path]:
    """Several sizes, RGB and grey, PNG and JPEG, one stored sideways (EXIF 6), tinted, shaded, blank."""
    folder.mkdir()
    page = with_digit(vignetted())
    files = {
        "vignette.png": Image.fromarray(page),
        "tinted.jpg": Image.fromarray((np.stack([page] * 3, -1) * (1.0, 0.96, 0.86)).astype(np.uint8)),
        "small.png": Image.fromarray(page).resize((70, 52)),
        "large.jpg": Image.fromarray(page).resize((800, 600)).convert("RGB"),
        "mnist_sized.png": Image.fromarray(255 - page).resize((28, 28)),
        "blank.jpg": Image.fromarray(vignetted().clip(0, 255).astype(np.uint8)),
    }
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    files["shaded.png"] = Image.fromarray(with_digit(vignetted() * (1 - 0.35 * (x < 70 + y / 3)))).convert("RGB")
    paths = []
    for name, image in files.items():
        image.save(folder / name, quality=80) if name.endswith(".jpg") else image.save(folder / name)
        paths.append(folder / name)
    exif = Image.Exif()
    exif[0x0112] = 6
    files["large.jpg"].transpose(Image.Transpose.ROTATE_90).save(folder / "sideways.jpg", exif=exif, quality=85)
    return [*paths, folder / "sideways.jpg"]


def exported(lenet5, tmp_path: Path) -> Path:
    from capsexp.use.export import export

    images = torch.zeros(2, 1, 28, 28, dtype=torch.uint8)
    return export(lenet5, "torchscript", tmp_path / "export" / "model.pt", images=images)


def run_prepare(folder: Path, *arguments: str) -> np.ndarray:
    """prepare.py in a new Python with torch and capsexp made unimportable: it needs only NumPy and Pillow."""
    blocked = "import sys; sys.modules.update(torch=None, capsexp=None, torchvision=None); "
    script = (
        blocked
        + "import runpy; sys.argv = ['prepare.py', *sys.argv[1:]]; runpy.run_path('prepare.py', run_name='__main__')"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, "model.json", *arguments, "--output", "inputs.npy"],
        cwd=folder,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return np.load(folder / "inputs.npy")


def test_prepare_py_beside_an_export_gives_capsexps_own_input_on_peoples_files(lenet5, tmp_path):
    """Equal to the last grey level (uint8: both run the same arithmetic on the same decoded pixels, so any
    difference would be a port's), the sideways photo turned upright, the blank page empty."""
    folder = exported(lenet5, tmp_path).parent
    files = peoples_files(tmp_path / "files")
    theirs = run_prepare(folder, *[str(Path("..") / "files" / f.name) for f in files])
    ours = np.stack([lenet5.read(f).pixels.numpy() for f in files])
    assert theirs.dtype == np.uint8 and theirs.shape == ours.shape == (len(files), 1, 28, 28)
    assert np.array_equal(theirs, ours), np.abs(theirs.astype(int) - ours).max(axis=(1, 2, 3))
    assert ours[[f.name for f in files].index("blank.jpg")].max() == 0
    assert ours[[f.name for f in files].index("vignette.png")].max() == 255
    forced = run_prepare(folder, str(Path("..") / "files" / "vignette.png"), "--invert", "false")
    assert np.array_equal(forced[0], lenet5.read(files[0], invert="false").pixels.numpy())


def test_model_json_holds_every_parameter_and_prepare_py_reads_them_from_it(lenet5, tmp_path, monkeypatch):
    """The parameters are read from model.json, not repeated in prepare.py: a model.json edited to need ink
    darker than any on the page makes prepare.py call the page blank."""
    folder = exported(lenet5, tmp_path).parent
    written = json.loads((folder / "model.json").read_text())["preprocessing"]
    for field in ("background_grid", "background_filter", "background_margin", "faintest_ink", "ground_level"):
        assert written[field] == getattr(conventions.PAGE, field)
    assert {k: written[k] for k in ("size", "light_ink", "digit_box", "digit", "channels")} == {
        "size": 28,
        "light_ink": True,
        "digit_box": 20,
        "digit": 28,
        "channels": 1,
    }
    assert set(dataclasses.asdict(conventions.PAGE)) <= set(written)
    Image.fromarray(with_digit(vignetted())).save(tmp_path / "digit.png")
    assert run_prepare(folder, "../digit.png").max() == 255
    sidecar = json.loads((folder / "model.json").read_text())
    sidecar["preprocessing"]["faintest_ink"] = 0.99
    (folder / "model.json").write_text(json.dumps(sidecar))
    assert run_prepare(folder, "../digit.png").max() == 0
