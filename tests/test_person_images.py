"""A person's files become the model's input as its dataset's images were made: light ink on dark for
MNIST-family data, digits framed as LeCun et al. framed MNIST's (20x20 box, centred by mass in 28x28),
phone photos upright, 16-bit, palette, CMYK and transparent files read; every file of a folder predicted
or named as skipped; an image on which no class is present said so."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageChops

from capsexp.data.conventions import ImageConventions, fit
from capsexp.data.images import read_image
from capsexp.data.mnist import digit_conventions
from capsexp.lit.objectives import CapsuleLoss
from capsexp.use.request import image_files
from tests.helpers import has_real_mnist, real_data_dir

MNIST = digit_conventions(28)


def mnist_test_digits(count: int) -> np.ndarray:
    raw = real_data_dir() / "MNIST" / "raw" / "t10k-images-idx3-ubyte"
    return np.frombuffer(raw.read_bytes()[16:], np.uint8).reshape(-1, 28, 28)[:count]


def drawn_on_paper(digit: np.ndarray, side: int, page: int, at: tuple[int, int], quality: int = 85) -> np.ndarray:
    """An MNIST digit as a person's file: dark ink on light grey paper, ``side`` pixels high at ``at`` on a
    ``page`` x ``page`` sheet, saved as a colour JPEG, read back as grey."""
    ink = Image.new("L", (page, page), 255)
    ink.paste(Image.fromarray(255 - digit).resize((side, side), Image.BICUBIC), at)
    sheet = ImageChops.darker(Image.new("L", (page, page), 232), ink)  # ink on the paper's grey
    buffer = io.BytesIO()
    sheet.convert("RGB").save(buffer, "JPEG", quality=quality)
    return np.array(Image.open(io.BytesIO(buffer.getvalue())).convert("L"))


@pytest.mark.skipif(not has_real_mnist(real_data_dir()), reason="needs the real MNIST files")
@pytest.mark.parametrize("side,at", [(40, (150, 12)), (100, (20, 90)), (200, (0, 0))], ids=["small", "mid", "filling"])
def test_mnist_digits_redrawn_as_peoples_files_come_back_as_the_digits(side, at):
    """Framed, a redrawn digit differs from the MNIST original by a few grey levels a pixel on average
    (JPEG, resampling); fitted by resizing the page, as before, it is another image."""
    digits = mnist_test_digits(40)
    framed, plain = [], []
    for digit in digits:
        page = torch.from_numpy(drawn_on_paper(digit, side, 200, at))[None]
        made, notes = fit(page, MNIST)
        assert notes[0].startswith("inverted: dark ink on a light ground") and notes[1].startswith("framed as")
        framed.append(np.abs(made[0].numpy().astype(float) - digit).mean())
        plain.append(np.abs(fit(page, MNIST, plain=True)[0][0].numpy().astype(float) - digit).mean())
    assert np.mean(framed) < 14 and np.mean(plain) > 150, (np.mean(framed), np.mean(plain))


def test_a_digit_is_framed_in_20_pixels_and_centred_by_its_mass():
    """An L-shaped stroke, 60 high and 30 wide, light on dark at the corner of a 90x120 page: its box becomes
    20x10, and its centre of mass (computed here with NumPy) lands at (14, 14)."""
    page = torch.zeros(1, 90, 120, dtype=torch.uint8)
    page[0, 5:65, 70:76] = 255  # the upright
    page[0, 59:65, 70:100] = 255  # the foot
    made, notes = fit(page, MNIST)
    ink = made[0].numpy().astype(float)
    rows, columns = np.nonzero(ink > 64)
    assert rows.max() - rows.min() + 1 == 20 and columns.max() - columns.min() + 1 == 10
    centre = [(ink.sum(axis=1 - axis) * np.arange(28)).sum() / ink.sum() for axis in (0, 1)]
    assert np.allclose(centre, [14, 14], atol=0.5), centre
    assert notes == [
        "framed as MNIST's digits: the ink's 60x30 box scaled to 20 pixels on its longer side, centred by its "
        "mass in 28x28"
    ]


def test_polarity_is_turned_only_where_the_ink_is_dark_and_mnists_own_digits_are_kept():
    dark_on_light = torch.full((1, 28, 28), 240, dtype=torch.uint8)
    dark_on_light[0, 6:22, 12:15] = 10
    made, notes = fit(dark_on_light, MNIST)
    assert torch.equal(made, 255 - dark_on_light) and notes == [
        "inverted: dark ink on a light ground, where the model's training images are light on dark"
    ]
    light_on_dark = 255 - dark_on_light
    assert fit(light_on_dark, MNIST) == (light_on_dark, [])
    # A dataset of photographs has no polarity to restore: a light ground stays light.
    photos = ImageConventions(size=28)
    assert fit(dark_on_light, photos) == (dark_on_light, [])


def test_a_blank_page_is_given_as_an_empty_image_and_said_so():
    made, notes = fit(torch.full((1, 60, 80), 230, dtype=torch.uint8), MNIST)
    assert made.shape == (1, 28, 28) and made.max() == 0
    assert notes[-1].startswith("no ink found (a blank page)")


def test_a_digit_on_a_canvas_dataset_is_framed_then_placed_at_the_canvas_centre():
    page = torch.zeros(1, 70, 70, dtype=torch.uint8)
    page[0, 10:60, 30:40] = 200
    made, notes = fit(page, digit_conventions(40))
    framed, _ = fit(page, MNIST)
    assert made.shape == (1, 40, 40) and torch.equal(made[:, 6:34, 6:34], framed) and made.sum() == framed.sum()
    assert notes[-1] == "placed at the centre of the 40x40 canvas"


def test_a_phone_photo_stored_sideways_is_read_upright(tmp_path):
    upright = np.zeros((40, 30), np.uint8)
    upright[5:35, 8:12] = 255
    upright[5:9, 8:25] = 255  # a "7"-like stroke: no rotation of it looks the same
    # The camera stores the pixels turned and says so in EXIF (orientation 6: rotate 90 degrees clockwise).
    stored = Image.fromarray(upright).transpose(Image.Transpose.ROTATE_90)
    exif = Image.Exif()
    exif[0x0112] = 6
    stored.save(tmp_path / "phone.jpg", quality=95, exif=exif)
    pixels, notes = read_image(tmp_path / "phone.jpg", "L")
    assert pixels.shape == (1, 40, 30) and notes == ["turned upright by its EXIF orientation (6)"]
    assert np.abs(pixels[0].numpy().astype(float) - upright).mean() < 6


def test_wide_grey_palette_cmyk_and_transparent_files_are_read_as_they_look(tmp_path):
    levels = np.array([[0, 64, 128, 255]], np.uint16).repeat(4, axis=0)
    Image.fromarray(levels * 257).save(tmp_path / "sixteen.png")  # 16-bit grey: Pillow's convert would clip
    pixels, notes = read_image(tmp_path / "sixteen.png", "L")
    assert pixels[0].tolist() == levels.tolist() and notes == ["I;16 pixels scaled to 8 bits"]
    drawing = Image.new("RGBA", (8, 8), (0, 0, 0, 0))  # a transparent sheet
    drawing.putpixel((3, 3), (0, 0, 0, 255))  # one black dot
    pixels, notes = read_image(drawing, "L")
    assert pixels[0, 3, 3] == 0 and (pixels[0] == 255).sum() == 63 and "transparent pixels put on white" in notes
    Image.new("CMYK", (6, 6), (0, 0, 0, 255)).save(tmp_path / "print.jpg")  # all black ink
    assert read_image(tmp_path / "print.jpg", "L")[0].max() < 10
    Image.new("P", (5, 5), 3).save(tmp_path / "anim.gif")
    assert read_image(tmp_path / "anim.gif", "L")[0].shape == (1, 5, 5)


def test_every_file_of_a_folder_is_predicted_or_named_as_skipped_with_the_reason(tmp_path):
    names = ("a.png", "b.GIF", "c.jpeg", "notes.txt", ".DS_Store", "sub/d.webp", "sub/README", ".cache/e.png")
    for name in names:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    found = image_files(str(tmp_path))
    assert [p.relative_to(tmp_path).as_posix() for p in found.files] == ["a.png", "b.GIF", "c.jpeg", "sub/d.webp"]
    assert {p.relative_to(tmp_path).as_posix(): reason for p, reason in found.skipped} == {
        ".DS_Store": "hidden file",
        "notes.txt": "not an image by its ending (.txt)",
        "sub/README": "not an image by its ending (none)",
        ".cache/e.png": "in a hidden folder",
    }


def test_a_class_is_present_where_its_score_reaches_the_midpoint_of_the_margin_losss_targets():
    assert CapsuleLoss(m_pos=0.8, m_neg=0.3).presence_threshold == pytest.approx(0.55)
    assert CapsuleLoss().presence_threshold == pytest.approx(0.5)


def test_predict_flags_images_without_a_class_and_names_skipped_files(tmp_path, monkeypatch):
    """A capsule model's rows say whether a class is present (its score against the threshold), the lines
    of absent ones say no digit was found, and the summary counts them and lists the skipped files."""
    from tests.helpers import TINY_RUN, run_cli_in_process, write_mnist
    from tests.test_trained_models import TINY_CAPSNET, predict_cli

    data_dir = write_mnist(tmp_path / "data")
    run = tmp_path / "run"
    trained = run_cli_in_process(
        *TINY_RUN,
        *TINY_CAPSNET,
        f"paths.data_dir={data_dir}",
        "trainer.max_steps=2",
        # A threshold of 0.013 (the midpoint of 0.026 and 0): two steps leave capsule lengths about it.
        "model.objective.m_pos=0.026",
        "model.objective.m_neg=0",
        f"hydra.run.dir={run}",
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    import capsexp

    images = tmp_path / "images"
    images.mkdir()
    for k in range(6):
        page = np.full((50, 40), 235, np.uint8)
        page[10 + k : 40, 15 : 20 + k] = 20
        Image.fromarray(page).save(images / f"{k}.png")
    (images / "notes.txt").write_text("not an image")
    scores = capsexp.load(run).predict(sorted(images.glob("*.png"))).scores.max(dim=1).values
    result = predict_cli(f"ckpt_path={run}", f"images={images}", "explain=0", f"hydra.run.dir={tmp_path / 'out'}")
    assert result.returncode == 0, result.stderr[-2000:]
    with open(tmp_path / "out" / "predictions.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["present"] for row in rows] == [str(int(s >= 0.013)) for s in scores.tolist()]
    absent = [row["file"] for row in rows if row["present"] == "0"]
    assert 0 < len(absent) < len(rows)  # both kinds of line are checked
    lines = [line for line in result.stdout.splitlines() if ": no digit found (" in line and not line.startswith("[")]
    assert sorted(line.split(":")[0] for line in lines) == absent
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert f"- no digit found: {len(absent)} of 6" in summary
    assert "`notes.txt`: not an image by its ending (.txt)" in summary
    assert all("inverted" in row["notes"] and "framed as MNIST's digits" in row["notes"] for row in rows)


@pytest.mark.slow
@pytest.mark.skipif(not has_real_mnist(real_data_dir()), reason="needs the real MNIST files")
def test_a_model_predicts_peoples_files_of_mnist_digits_within_8_points_of_the_digits_themselves(tmp_path):
    """LeNet5 trained on real MNIST (600 steps), asked about 300 test digits as PNG files and redrawn as
    people's files come (experiments/peoples_files.py): the accuracies within 8 points, each drawn file
    with a note of what was done; resizing the page alone (fit=plain) is far off."""
    from capsexp.use.predict import predict
    from peoples_files import write_people_files, write_pngs
    from tests.helpers import run_cli_in_process

    run = tmp_path / "run"
    trained = run_cli_in_process(
        "model=lenet5",
        f"paths.data_dir={real_data_dir()}",
        "trainer.max_steps=600",
        "trainer.val_check_interval=600",
        "trainer.limit_val_batches=20",
        "test=false",
        "callbacks.progress_bar=null",
        f"hydra.run.dir={run}",
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    digits = mnist_test_digits(300)
    raw = real_data_dir() / "MNIST" / "raw" / "t10k-labels-idx1-ubyte"
    labels = np.frombuffer(raw.read_bytes()[8:], np.uint8)[:300]
    from omegaconf import open_dict

    from capsexp.config.hydra_setup import compose

    def accuracy(folder: Path, *overrides: str) -> float:
        cfg = compose([f"ckpt_path={run}", f"images={folder}", "explain=0", "lines=0", *overrides], "predict")
        with open_dict(cfg):
            cfg.paths.output_dir = str(tmp_path / f"out_{folder.name}_{len(overrides)}")
        return predict(cfg)["accuracy"]

    pngs = accuracy(write_pngs(digits, labels, tmp_path / "pngs"))
    people = accuracy(write_people_files(digits, labels, tmp_path / "people"))
    plain = accuracy(tmp_path / "people", "fit=plain")
    assert pngs > 0.9 and people > pngs - 0.08 and plain < 0.5, (pngs, people, plain)


def test_a_wide_image_is_squared_by_its_centre_not_stretched_and_a_stereo_views_file_read_as_grey(tmp_path):
    """A 40x20 image whose left and right quarters are white: resized on its shorter side (already 20) and
    cropped to its centre 20 columns, which hold no white; a stretch would keep both bands. A colour file
    read for a stereo model (2 channels, a view per file) is one grey channel, as for a grey model."""
    from capsexp.data.images import pil_mode, square

    image = torch.zeros(1, 20, 40, dtype=torch.uint8)
    image[..., :10] = image[..., 30:] = 255
    image[..., 10:30] = torch.arange(20, dtype=torch.uint8)  # a ramp: the crop's columns in order
    squared = square(image, 20)
    assert torch.equal(squared, image[..., 10:30])
    colour = tmp_path / "view.png"
    Image.fromarray(np.full((6, 6, 3), (200, 40, 10), dtype=np.uint8)).save(colour)
    pixels, _ = read_image(colour, pil_mode(2))
    assert pixels.shape == (1, 6, 6) and pil_mode(1) == pil_mode(2) == "L" and pil_mode(3) == "RGB"
    assert int(pixels[0, 0, 0]) == round(0.299 * 200 + 0.587 * 40 + 0.114 * 10)  # ITU-R 601-2 luma


def test_fit_plain_keeps_an_image_of_the_evaluation_size_and_squares_any_other_even_of_its_width():
    """fit=plain: a 28x28 image as it is, without a note; a 40x28 one (its width the evaluation size, its
    height not) squared by its centre, and said so."""
    from capsexp.data.conventions import ImageConventions, fit

    conventions = ImageConventions(size=28)
    same = torch.randint(0, 256, (1, 28, 28), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    assert fit(same, conventions, plain=True) == (same, [])
    tall = torch.randint(0, 256, (1, 40, 28), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    fitted, notes = fit(tall, conventions, plain=True)
    assert torch.equal(fitted, tall[:, 6:34]) and notes == ["resized (shorter side to 28, centre crop): fit=plain"]
