"""Your own images (``data=image_folder data.root=<folder>``): the ImageFolder layout read, split, resized
and cached; each kind of bad folder ends in a short error that names it; grey and colour runs train."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from capsexp.data import ImageFolderDataModule
from capsexp.errors import ConfigError, CorruptDatasetError, DatasetNotFoundError
from tests.helpers import COLOURS, TINY_EM_CAPS, TINY_RUN, run_cli_in_process, scalars, two_step_run, write_png
from tests.helpers import write_image_folder as write_images


def prepared(root: Path, tmp_path: Path, **kwargs) -> ImageFolderDataModule:
    datamodule = ImageFolderDataModule(root=root, data_dir=tmp_path / "cache", **kwargs)
    datamodule.prepare_data()
    datamodule.setup("fit")
    return datamodule


def test_one_folder_is_split_by_seeded_fractions_resized_and_read_in_colour_or_grey(tmp_path):
    write_images(tmp_path / "images")
    colour = prepared(tmp_path / "images", tmp_path, channels=3, image_size=32)
    assert colour.class_names == list(COLOURS) and colour.dims == (3, 32, 32)
    assert (len(colour.data_train), len(colour.data_val), len(colour.data_test)) == (
        49,
        5,
        6,
    )  # 60: 10% test, 10% of the other 54 for validation
    assert colour.data_train.images.shape[1:] == (3, 32, 32) and colour.data_train.images.dtype == torch.uint8
    # Each image's dominant channel is its class's: the colours survived decoding, resizing and cropping.
    images, targets = colour.data_train.tensors
    dominant = images.float().mean(dim=(2, 3)).argmax(dim=1)
    assert torch.equal(dominant, torch.tensor([2, 1, 0])[targets])
    grey = prepared(tmp_path / "images", tmp_path, channels=1, image_size=20)
    assert grey.data_train.images.shape[1:] == (1, 20, 20)
    assert torch.equal(grey.data_test.targets, colour.data_test.targets)  # the same seeded split
    pixels, _ = grey.pixel_batch((grey.data_test.images, grey.data_test.targets), 0)
    assert pixels.dtype == torch.float32 and pixels.min() >= 0 and pixels.max() <= 1


def test_train_val_and_test_folders_are_the_splits(tmp_path):
    for split, count in (("train", 10), ("val", 3), ("test", 4)):
        write_images(tmp_path / "images" / split, per_class=count, seed=len(split))
    datamodule = prepared(tmp_path / "images", tmp_path, channels=3)
    assert (len(datamodule.data_train), len(datamodule.data_val), len(datamodule.data_test)) == (30, 9, 12)
    assert datamodule.class_names == list(COLOURS)
    without_val = tmp_path / "no_val"
    for split in ("train", "test"):
        write_images(without_val / split, per_class=10)
    datamodule = prepared(without_val, tmp_path, val_fraction=0.2)
    assert (len(datamodule.data_train), len(datamodule.data_val), len(datamodule.data_test)) == (24, 6, 30)


def test_the_decoded_images_are_cached_until_a_file_changes(tmp_path):
    write_images(tmp_path / "images", per_class=4)
    datamodule = prepared(tmp_path / "images", tmp_path)
    built = datamodule.cache_path.stat().st_mtime_ns
    prepared(tmp_path / "images", tmp_path)
    assert datamodule.cache_path.stat().st_mtime_ns == built
    write_png(torch.zeros(3, 36, 40, dtype=torch.uint8), str(tmp_path / "images" / "red" / "new.png"))
    assert len(prepared(tmp_path / "images", tmp_path).data_train.images) > len(datamodule.data_train.images)


def test_each_bad_folder_gets_an_error_that_names_it(tmp_path):
    # Found when the data is prepared (a trained model's preprocessing is rebuilt without its images).
    with pytest.raises(DatasetNotFoundError, match="no such folder"):
        prepared(tmp_path / "missing", tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetNotFoundError, match="no class folders in it"):
        prepared(tmp_path / "empty", tmp_path)
    (tmp_path / "single" / "cats").mkdir(parents=True)
    with pytest.raises(DatasetNotFoundError, match=r"one class folder \(cats\); a classifier needs two classes"):
        prepared(tmp_path / "single", tmp_path)
    write_images(tmp_path / "one_empty", per_class=3)
    (tmp_path / "one_empty" / "yellow").mkdir()
    (tmp_path / "one_empty" / "yellow" / "notes.txt").write_text("not an image")
    with pytest.raises(DatasetNotFoundError, match=r"1 class folder hold no images .*one_empty/yellow"):
        prepared(tmp_path / "one_empty", tmp_path)
    write_images(tmp_path / "broken", per_class=3)
    for name in ("bad1.png", "bad2.jpg"):
        (tmp_path / "broken" / "red" / name).write_bytes(b"not an image at all")
    with pytest.raises(CorruptDatasetError, match=r"2 of 11 image files could not be read as images: .*bad1\.png"):
        prepared(tmp_path / "broken", tmp_path)
    write_images(tmp_path / "sizes", per_class=2, size=(28, 28))
    write_png(torch.zeros(3, 30, 28, dtype=torch.uint8), str(tmp_path / "sizes" / "red" / "tall.png"))
    with pytest.raises(ConfigError, match=r"1 of 7 images are not 28x28: .*tall\.png \(28x30\)"):
        prepared(tmp_path / "sizes", tmp_path, resize=False)
    assert len(prepared(tmp_path / "sizes", tmp_path, resize=True).data_train) > 0


def test_a_missing_folder_on_the_command_line_is_a_few_lines(tmp_path):
    result = run_cli_in_process("data=image_folder", f"data.root={tmp_path / 'nope'}", "model=lenet5")
    assert result.returncode == 2
    assert "model.num_classes, model.net.num_classes: data.root=" in result.stderr and "no such folder" in result.stderr
    assert "Traceback" not in result.stderr


# CapsNet's run is slow (make test-all); the routing and colour-data CLI tests train it on colour input too.
@pytest.mark.parametrize("model", ["lenet5", pytest.param("capsnet_small", marks=pytest.mark.slow)])
def test_a_colour_folder_trains_and_its_classes_are_the_models_outputs(model, tmp_path):
    write_images(tmp_path / "images", per_class=30)
    result = run_cli_in_process(
        *(o for o in TINY_RUN if not o.startswith("data.")),  # MNIST's keys
        "data=image_folder",
        f"data.root={tmp_path / 'images'}",
        f"paths.data_dir={tmp_path / 'cache'}",
        "data.channels=3",
        "data.image_size=32",
        "data.batch_size=9",
        f"model={model}",
        "trainer.max_epochs=3",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    logged = scalars(tmp_path / "run")
    assert logged["test/acc"][-1].value >= 0.9  # dominant colour: separable within a few steps


@pytest.mark.parametrize(
    ("model", "extra"),
    [
        ("baseline_cnn", ["model.net.conv_layers=[8,8,4]", "model.net.hidden_sizes=[16,8]"]),
        ("em_caps_small", TINY_EM_CAPS),
    ],
)
def test_the_other_models_train_on_colour_images_too(model, extra, colour_folder, tmp_path):
    """The models the colour test above leaves out, two steps each at a tiny width: they build for 3x32x32
    input, train, validate and test."""
    logged = two_step_run(
        tmp_path / "run",
        *(o for o in TINY_RUN if not o.startswith("data.")),
        "data=image_folder",
        f"data.root={colour_folder}",
        f"paths.data_dir={tmp_path / 'cache'}",
        "data.channels=3",
        "data.image_size=32",
        "data.batch_size=8",
        f"model={model}",
        *extra,
    )
    assert "test/acc" in logged
