"""New viewpoints for translated MNIST: the generated affine-MNIST test set and the official affNIST test
files (written here in the official format: MATLAB structs ``affNISTdata``)."""

from __future__ import annotations

import hashlib
import logging
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.io import savemat

from capsexp.data import MNISTDataModule, affnist
from capsexp.data.affnist import AFFNIST_URL, download_affnist, ensure_affnist_files, read_affnist_test, read_batch
from capsexp.data.augment import AffineRanges, random_affine, random_placement
from capsexp.errors import CorruptDatasetError, DatasetNotFoundError
from tests.helpers import FakeTrainer


def test_random_affine_without_deformation_is_a_placement_that_keeps_all_the_ink():
    digits = torch.zeros(400, 1, 28, 28, dtype=torch.uint8)
    digits[:, :, 6:20, 9:17] = torch.randint(1, 256, (400, 1, 14, 8), dtype=torch.uint8)
    still = AffineRanges(rotation=0, shear=0, scale=(1.0, 1.0))
    placed = random_affine(digits, 40, torch.Generator().manual_seed(0), still)
    assert placed.shape == (400, 1, 40, 40) and placed.dtype == torch.uint8
    assert torch.equal(placed.sum((1, 2, 3)), digits.sum((1, 2, 3), dtype=torch.int64))  # nothing cut off
    ink = placed[:, 0] > 0
    tops, lefts = ink.any(2).float().argmax(1), ink.any(1).float().argmax(1)
    assert set(tops.tolist()) == set(range(40 - 14 + 1)) and set(lefts.tolist()) == set(range(40 - 8 + 1))
    # each output is the digit's ink moved whole
    first = placed[0, 0, tops[0] : tops[0] + 14, lefts[0] : lefts[0] + 8]
    assert torch.equal(first, digits[0, 0, 6:20, 9:17])


def test_random_affine_is_seeded_and_deforms_within_its_ranges():
    digits = torch.zeros(300, 1, 28, 28)
    digits[:, :, 4:24, 12:16] = 1.0  # an upright bar, 20 high and 4 wide
    draw = lambda seed: random_affine(digits, 40, torch.Generator().manual_seed(seed))  # noqa: E731
    first, again, other = draw(0), draw(0), draw(1)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert first.amin() >= 0 and first.amax() <= 1
    # Ink area scales by scale_x * scale_y (shear and rotation keep area): within 0.8^2 .. 1.2^2.
    area = first.sum((1, 2, 3)) / digits.sum((1, 2, 3))
    assert area.min() > 0.8**2 - 0.05 and area.max() < 1.2**2 + 0.05 and area.std() > 0.05
    # The bar's height varies with the vertical scale and the rotation, never beyond their reach.
    rows = (first[:, 0] > 0.5).any(2).sum(1).float()
    assert rows.min() >= 20 * 0.8 * np.cos(np.radians(20)) - 2 and rows.max() <= 20 * 1.2 + 2 and rows.std() > 1


def test_random_affine_places_the_thinnest_ink_anywhere_and_keeps_the_callers_dtype():
    """A single pixel (ink one row high and one column wide) in the image's first row and column, on a
    canvas the size of the image: every row and column is a place it may land, each one equally likely."""
    dot = torch.zeros(2000, 1, 28, 28, dtype=torch.float64)
    dot[:, :, 0, 0] = 0.5
    still = AffineRanges(rotation=0, shear=0, scale=(1.0, 1.0))
    placed = random_affine(dot, 28, torch.Generator().manual_seed(0), still)
    assert placed.dtype == torch.float64
    torch.testing.assert_close(placed.sum((1, 2, 3)), dot.sum((1, 2, 3)), rtol=1e-6, atol=0)  # whole (float32 warp)
    rows, cols = (placed[:, 0] > 0).any(2).double().argmax(1), (placed[:, 0] > 0).any(1).double().argmax(1)
    for position in (rows, cols):
        counts = torch.bincount(position, minlength=28)
        assert (counts > 0).all() and counts.max() < 3 * counts.min()  # every place, no favourite
    # without a generator: torch's global one
    torch.manual_seed(0)
    unseeded = random_affine(dot[:50], 28, ranges=still)
    torch.manual_seed(0)
    assert torch.equal(unseeded, random_affine(dot[:50], 28, ranges=still))
    with pytest.raises(ValueError, match=r"^canvas=27 is smaller than the 28x28 images$"):
        random_affine(dot, 27)


def affine_by_hand(image: np.ndarray, canvas: int, draws: list[float], ranges: AffineRanges) -> np.ndarray:
    """One image (H, W) through random_affine's map, written with scipy from its docstring: centred on the
    canvas; scaled (x by s_x, y by s_y), sheared (x += shear * y), rotated by the angle, about the canvas
    centre; bilinear, zero outside; then shifted so that its ink's bounding box starts at a uniformly drawn
    row and column where all of it stays on the canvas. ``draws``: its six uniform numbers in [0, 1), in the
    order angle, shear, s_x, s_y, row shift, column shift."""
    from scipy.ndimage import affine_transform

    angle = np.deg2rad(-ranges.rotation + 2 * ranges.rotation * draws[0])
    shear = -ranges.shear + 2 * ranges.shear * draws[1]
    low, high = ranges.scale
    scale_x, scale_y = low + (high - low) * draws[2], low + (high - low) * draws[3]
    rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    forward = rotation @ np.array([[1, shear], [0, 1]]) @ np.diag([scale_x, scale_y])  # on (x, y)
    swap = np.array([[0, 1], [1, 0]])  # (x, y) <-> (row, column)
    inverse = swap @ np.linalg.inv(forward) @ swap  # output (row, column) -> input (row, column)
    height, width = image.shape
    padded = np.zeros((canvas, canvas))
    top, left = (canvas - height) // 2, (canvas - width) // 2
    padded[top : top + height, left : left + width] = image
    centre = np.full(2, (canvas - 1) / 2)
    warped = affine_transform(padded, inverse, offset=centre - inverse @ centre, order=1, mode="grid-constant")
    placed = np.zeros_like(warped)
    rows, cols = np.nonzero(warped > 0)
    shifts = []
    for first, last, draw in ((rows.min(), rows.max(), draws[4]), (cols.min(), cols.max(), draws[5])):
        choices = canvas - (last - first)  # where the box may start: 0 .. canvas - 1 - (last - first)
        shifts.append(min(int(draw * choices), choices - 1) - first)
    source = warped[max(0, -shifts[0]) : canvas - max(0, shifts[0]), max(0, -shifts[1]) : canvas - max(0, shifts[1])]
    placed[
        max(0, shifts[0]) : max(0, shifts[0]) + source.shape[0], max(0, shifts[1]) : max(0, shifts[1]) + source.shape[1]
    ] = source
    return placed


def test_random_affine_is_the_documented_map_with_its_draws_in_order():
    """Each image against the map computed with scipy from the draws of a generator seeded alike (the
    order of the draws is part of the contract: it fixes the affine test set of a placement seed)."""
    rng = np.random.default_rng(0)
    images = np.zeros((6, 12, 12))
    images[:, 3:9, 4:8] = rng.uniform(0.2, 1.0, (6, 6, 4))  # an off-centre blob: rotations and shears show
    images[:, 2, 2] = 1.0
    ranges = AffineRanges(rotation=30, shear=0.3, scale=(0.7, 1.3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing for the user to read (e.g. torch's on align_corners)
        placed = random_affine(torch.from_numpy(images).float()[:, None], 30, torch.Generator().manual_seed(5), ranges)
    replay = torch.Generator().manual_seed(5)
    draws = torch.stack([torch.rand(6, generator=replay) for _ in range(6)], dim=1).double().numpy()
    for index in range(6):
        expected = affine_by_hand(images[index], 30, list(draws[index]), ranges)
        np.testing.assert_allclose(placed[index, 0].numpy(), expected, atol=1e-5)
    assert len({tuple(np.argwhere(p[0].numpy() > 0).min(0)) for p in placed}) == 6  # six placements
    # uint8 digits come back as uint8, rounded.
    as_bytes = random_affine(
        torch.from_numpy(images * 255).to(torch.uint8)[:, None], 30, torch.Generator().manual_seed(5), ranges
    )
    assert as_bytes.dtype == torch.uint8
    expected = np.round(affine_by_hand(np.round(images[0] * 255), 30, list(draws[0]), ranges))
    np.testing.assert_allclose(as_bytes[0, 0].numpy(), expected, atol=1)


def write_affnist(data_dir: Path, batches: int, per_batch: int = 20) -> list[tuple[np.ndarray, np.ndarray]]:
    """``batches`` files ``1.mat`` .. in ``<data_dir>/affNIST/test_batches/``, affNIST's struct layout."""
    folder = data_dir / "affNIST" / "test_batches"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    written = []
    for index in range(1, batches + 1):
        images = rng.integers(0, 256, (per_batch, 40, 40), dtype=np.uint8)
        labels = rng.integers(0, 10, per_batch, dtype=np.uint8)
        columns = images.reshape(per_batch, 1600).T  # one row-major image per column
        savemat(folder / f"{index}.mat", {"affNISTdata": {"image": columns, "label_int": labels[None, :]}})
        written.append((images, labels))
    return written


def test_translated_mnist_tests_on_generated_affine_digits_and_the_official_affnist_files(mnist_dir):
    written = write_affnist(mnist_dir, batches=3)
    datamodule = MNISTDataModule(
        mnist_dir,
        batch_size=25,
        verify_checksums=False,
        download=False,
        canvas=40,
        extra_test_sets=["affine_mnist", "affnist"],
        affnist_batches=2,
    )
    datamodule.trainer = FakeTrainer(testing=True)
    datamodule.prepare_data()
    datamodule.setup("test")
    assert datamodule.test_set_names == ["", "affine_mnist", "affnist"]
    loaders = datamodule.test_dataloader()
    assert len(loaders) == 3
    affine, affnist = datamodule.extra_tests
    assert torch.equal(affine.targets, datamodule.data_test.targets)
    assert affine.images.shape == datamodule.data_test.images.shape == (100, 1, 40, 40)
    assert not torch.equal(affine.images, datamodule.data_test.images)
    expected = np.concatenate([images for images, _ in written[:2]])
    assert torch.equal(affnist.images[:, 0], torch.from_numpy(expected))  # rows stay rows
    assert affnist.targets.tolist() == np.concatenate([labels for _, labels in written[:2]]).tolist()
    images, _ = datamodule.on_after_batch_transfer(next(iter(loaders[2])), 2)
    assert images.shape == (25, 1, 40, 40) and images.max() <= 1


def test_the_affine_mnist_test_set_is_fixed_by_the_placement_seed_alone(mnist_dir):
    """The same digits under the same affine maps in every run that shares the placement seed, whatever
    the run's own seed; another placement seed, other maps."""

    def affine_test_set(placement_seed: int, run_seed: int) -> torch.Tensor:
        torch.manual_seed(run_seed)
        datamodule = MNISTDataModule(
            mnist_dir,
            verify_checksums=False,
            download=False,
            canvas=40,
            extra_test_sets=["affine_mnist"],
            placement_seed=placement_seed,
        )
        datamodule.trainer = FakeTrainer(testing=True)
        datamodule.prepare_data()
        datamodule.setup("test")
        return datamodule.extra_tests[0].images

    first = affine_test_set(placement_seed=0, run_seed=1)
    assert torch.equal(first, affine_test_set(placement_seed=0, run_seed=2))
    assert not torch.equal(first, affine_test_set(placement_seed=1, run_seed=1))


def test_missing_affnist_files_are_listed_five_at_most(tmp_path):
    folder = tmp_path / "affNIST" / "test_batches"
    for batches, listed in (
        (5, "  1.mat\n  2.mat\n  3.mat\n  4.mat\n  5.mat\n"),
        (6, "  1.mat\n  2.mat\n  3.mat\n  4.mat\n  5.mat\n  ...\n"),
    ):
        with pytest.raises(DatasetNotFoundError) as missing:
            ensure_affnist_files(tmp_path, batches, download=False)
        assert str(missing.value) == (
            f"affNIST test set not found: {batches} of the {batches} files asked for are missing in {folder}:\n"
            f"{listed}Downloading is off (data.download=false). Unpack {AFFNIST_URL} into {folder.parent}, or "
            "test on fewer files (data.affnist_batches), or leave affnist out of data.extra_test_sets."
        )


def test_affnist_problems_name_the_file(mnist_dir, tmp_path):
    write_affnist(mnist_dir, batches=1)
    datamodule = MNISTDataModule(
        mnist_dir, verify_checksums=False, download=False, canvas=40, extra_test_sets=["affnist"], affnist_batches=3
    )
    with pytest.raises(DatasetNotFoundError, match=r"2 of the 3 files asked for are missing(.|\n)*2\.mat(.|\n)*3\.mat"):
        datamodule.prepare_data()
    wrong = tmp_path / "wrong.mat"
    savemat(wrong, {"affNISTdata": {"image": np.zeros((28 * 28, 5), np.uint8), "label_int": np.zeros(5, np.uint8)}})
    with pytest.raises(CorruptDatasetError, match=r"wrong.mat: affNISTdata.image is uint8 \(784, 5\)"):
        read_batch(wrong)
    savemat(wrong, {"something": np.zeros(3)})
    with pytest.raises(CorruptDatasetError, match=r"wrong\.mat: no struct affNISTdata"):
        read_batch(wrong)
    wrong.write_bytes(b"not a mat file")
    with pytest.raises(CorruptDatasetError, match=r"wrong\.mat: not a MATLAB file"):
        read_batch(wrong)
    with pytest.raises(ValueError, match="the affnist test set's images are 40x40; canvas=36"):
        MNISTDataModule(canvas=36, extra_test_sets=["affnist"])
    with pytest.raises(ValueError, match="needs a canvas"):
        MNISTDataModule(extra_test_sets=["affine_mnist"])


def test_affnist_labels_are_checked_against_the_images_and_the_digit_range(tmp_path):
    wrong = tmp_path / "wrong.mat"
    images = np.zeros((1600, 5), np.uint8)
    savemat(wrong, {"affNISTdata": {"image": images, "label_int": np.zeros((1, 4), np.uint8)}})
    with pytest.raises(CorruptDatasetError, match=r"^\S*wrong\.mat: 4 labels \(label_int\) for 5 images$"):
        read_batch(wrong)
    for label in (10, 255):  # the upper end of the range is checked, whatever the lower end is
        labels = np.array([[0, 3, label, 9, 1]], np.uint8)
        savemat(wrong, {"affNISTdata": {"image": images, "label_int": labels}})
        with pytest.raises(CorruptDatasetError, match=rf"wrong\.mat: label_int outside 0-9 \(0\.\.{label}\)$"):
            read_batch(wrong)


def test_the_affnist_test_set_logs_which_files_it_read_and_never_downloads(mnist_dir, monkeypatch, caplog):
    written = write_affnist(mnist_dir, batches=2)
    monkeypatch.setattr(affnist, "download_affnist", lambda *args: pytest.fail("reading the test set downloaded"))
    with caplog.at_level(logging.INFO, logger="capsexp.data.affnist"):
        images, labels = read_affnist_test(mnist_dir, 2)
    assert images.shape == (40, 1, 40, 40) and images.dtype == torch.uint8 and labels.dtype == torch.int64
    assert labels.tolist() == [*written[0][1], *written[1][1]]
    md5 = [hashlib.md5((mnist_dir / "affNIST" / "test_batches" / f"{i}.mat").read_bytes()).hexdigest() for i in (1, 2)]
    assert caplog.messages == [f"affNIST test set: 40 images from 2 files; md5 1.mat {md5[0]}, 2.mat {md5[1]}"]
    with pytest.raises(DatasetNotFoundError, match=r"1 of the 3 files asked for are missing"):
        read_affnist_test(mnist_dir, 3)


def test_missing_affnist_files_are_downloaded_where_allowed_and_unpacked(tmp_path, monkeypatch, caplog):
    source = tmp_path / "source"
    write_affnist(source, batches=2)
    archive = tmp_path / "test_batches.zip"
    with zipfile.ZipFile(archive, "w") as bundle:  # the official zip holds test_batches/1.mat ..
        for index in (1, 2):
            bundle.write(source / "affNIST" / "test_batches" / f"{index}.mat", f"test_batches/{index}.mat")
    data_dir = tmp_path / "data"
    with pytest.raises(DatasetNotFoundError, match="Downloading is off"):
        ensure_affnist_files(data_dir, 2, download=False)
    fetched = []
    monkeypatch.setattr(
        affnist, "download_affnist", lambda where: fetched.append(where) or real(where, archive.as_uri())
    )
    real = download_affnist
    with caplog.at_level(logging.INFO, logger="capsexp.data.affnist"):
        files = ensure_affnist_files(data_dir, 2, download=True)
    assert fetched == [data_dir] and [path.name for path in files] == ["1.mat", "2.mat"]
    with pytest.raises(DatasetNotFoundError) as missing:  # downloaded, and still one short
        ensure_affnist_files(data_dir, 3, download=True)
    folder = data_dir / "affNIST" / "test_batches"
    assert str(missing.value) == (
        f"affNIST test set not found: 1 of the 3 files asked for are missing in {folder}:\n  3.mat\n"
        f"Unpack {AFFNIST_URL} into {folder.parent}, or test on fewer files (data.affnist_batches), "
        "or leave affnist out of data.extra_test_sets."
    )
    assert caplog.messages == [f"downloading {archive.as_uri()} (about 100 MB)"]
    assert files[1].read_bytes() == (source / "affNIST" / "test_batches" / "2.mat").read_bytes()
    assert sorted(path.name for path in (data_dir / "affNIST").iterdir()) == ["test_batches", "test_batches.zip"]
    # The zip, once downloaded, is unpacked again without a download (the URL is gone now).
    files[0].unlink()
    archive.unlink()
    download_affnist(data_dir, archive.as_uri())
    assert files[0].exists()
    # A failed download leaves nothing behind and says what to do by hand; a damaged zip says so.
    other = tmp_path / "other"
    with pytest.raises(
        DatasetNotFoundError, match=r"download of file://\S+ failed: (.|\n)*unpack it into \S+other/affNIST"
    ):
        download_affnist(other, (tmp_path / "nowhere.zip").as_uri())
    assert list((other / "affNIST").iterdir()) == []
    (other / "affNIST" / "test_batches.zip").write_bytes(b"not a zip")
    with pytest.raises(CorruptDatasetError, match=r"test_batches\.zip: not a valid zip file; delete it and download"):
        download_affnist(other, (tmp_path / "nowhere.zip").as_uri())


def test_a_canvas_the_size_of_the_digits_places_them_where_they_are():
    digits = torch.randint(0, 256, (5, 1, 28, 28), dtype=torch.uint8)
    assert torch.equal(random_placement(digits, 28, torch.Generator().manual_seed(0)), digits)
    assert random_affine(digits, 28, torch.Generator().manual_seed(0)).shape == digits.shape  # allowed too
    with pytest.raises(ValueError, match=r"^canvas=27 is smaller than the 28x28 images$"):
        random_placement(digits, 27)
