"""A trained model's ``transforms``: an image or a file -> the net's input with no DataModule, the tensor the
DataModule's own evaluation loop gives the net, written into ``model.json`` and rebuilt from it, and the
tensor ``predict`` gives the net."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from capsexp.data import page
from capsexp.data.transforms import EvaluationTransform
from tests.helpers import write_mnist, write_norb
from tests.test_colour_data import write_cifar, write_svhn
from tests.test_predict import evaluation_batch, untrained

DATASETS = {  # id -> (overrides, what writes its files in the official format)
    "mnist_normalized": (["data=mnist", "data.normalize=true", "data.val_size=10"], write_mnist),
    "translated_mnist": (["data=translated_mnist", "data.val_size=10"], write_mnist),
    "cifar10_crop24": (["data=cifar10", "model=lenet5", "data.crop_size=24", "data.val_size=10"], write_cifar),
    "svhn_unnormalized": (["data=svhn", "model=lenet5", "data.normalize=false", "data.val_size=10"], write_svhn),
    "smallnorb_stereo": (["data=smallnorb", "model=lenet5", "data.val_size=12"], write_norb),
    "smallnorb_left_crop24": (
        ["data=smallnorb", "model=lenet5", "data.stereo=left", "data.crop_size=24", "data.val_size=12"],
        write_norb,
    ),
}


def model_of(name: str, tmp_path):
    overrides, write = DATASETS[name]
    data_dir = tmp_path / "data"
    write(data_dir)
    return untrained([*overrides, f"paths.data_dir={data_dir}", "data.verify_checksums=false"], tmp_path)


@pytest.mark.parametrize("name", list(DATASETS))
def test_the_transform_read_back_from_json_gives_what_the_test_loop_gave_the_net(name, tmp_path):
    model = model_of(name, tmp_path)
    written = json.dumps(model.transforms.as_dict())  # as model.json holds it
    transform = EvaluationTransform.from_dict(json.loads(written))
    assert transform == model.transforms
    stored, _, expected = evaluation_batch(model.datamodule, 7)
    assert torch.equal(transform.inputs(stored), expected)
    assert tuple(expected.shape[1:]) == (transform.channels, transform.input_size, transform.input_size)


def test_a_transform_needs_no_datamodule_and_predict_gives_the_net_its_tensor(tmp_path, monkeypatch):
    """Files as a user types them (relative, in a dot-folder), more than a batch, of several sizes and modes."""
    model = model_of("smallnorb_left_crop24", tmp_path)
    transform = EvaluationTransform.from_dict(json.loads(json.dumps(model.transforms.as_dict())))
    photos = tmp_path / "work" / ".photos"
    photos.mkdir(parents=True)
    rng = np.random.default_rng(3)
    for index, (height, width, mode) in enumerate([(96, 96, "L"), (60, 40, "L"), (48, 48, "L"), (50, 70, "RGB")]):
        shape = (height, width, 3) if mode == "RGB" else (height, width)
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(photos / f"{index}.png")
    monkeypatch.chdir(tmp_path / "work")
    files = [f".photos/{index}.png" for index in range(4)]
    predicted = model.predict(files, batch_size=3)
    assert torch.equal(transform(files), predicted.inputs)
    assert torch.equal(transform(files[1]), predicted.inputs[1:2])


def test_an_official_size_smallnorb_image_is_downsampled_as_the_files_were_in_capsexp_and_in_prepare_py(tmp_path):
    model = model_of("smallnorb_stereo", tmp_path)
    rng = np.random.default_rng(5)
    pair = rng.integers(0, 256, (2, 96, 96), dtype=np.uint8)
    expected = np.rint(pair.astype(np.float64).reshape(2, 48, 2, 48, 2).mean(axis=(2, 4))).astype(np.uint8)
    read = model.transforms.read(torch.from_numpy(pair))
    assert np.array_equal(read.pixels.numpy(), expected)
    assert read.notes == ["downsampled 96 -> 48 by area averaging, as the dataset's images"]
    ours, notes = page.fit_page(pair, model.transforms.as_dict(), page.square)  # prepare.py's path, NumPy alone
    assert np.array_equal(ours, expected) and notes == read.notes
    plain = model.transforms.read(torch.from_numpy(pair), plain=True)  # fit=plain: the dataset's own size too
    assert np.array_equal(plain.pixels.numpy(), expected) and plain.notes == read.notes
    # Another size is resized and cropped, not area-averaged, and an image of the evaluation size kept.
    assert model.transforms.read(torch.from_numpy(pair[:, :90])).notes == ["resized (shorter side to 48, centre crop)"]
    assert torch.equal(model.transforms.read(torch.from_numpy(expected)).pixels, torch.from_numpy(expected))


def test_a_colour_models_transform_crops_its_32x32_images_as_the_test_set_and_standardises_each_channel(tmp_path):
    model = model_of("cifar10_crop24", tmp_path)
    transform = model.transforms
    assert (transform.size, transform.crop) == (32, 24)
    image = torch.from_numpy(np.random.default_rng(1).integers(0, 256, (3, 32, 32), dtype=np.uint8))
    assert transform.read(image).notes == []  # the stored size: kept, then centre-cropped below
    mean = torch.tensor(transform.mean).view(3, 1, 1)
    std = torch.tensor(transform.std).view(3, 1, 1)
    expected = (image[:, 4:28, 4:28].float() / 255 - mean) / std
    torch.testing.assert_close(transform(image)[0], expected)
