"""Fixtures: synthetic datasets written in the real file formats (helpers in tests/helpers.py)."""

from __future__ import annotations

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one pytest worker per core (pytest-xdist): one thread each, for the worker
    # and the CLI runs it starts, instead of every process using every core.
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = "1"

from pathlib import Path

import pytest

from capsexp.config import hydra_setup
from tests.helpers import has_real_mnist, real_data_dir, write_image_folder, write_mnist, write_norb

# Tests compose configs and resolve saved ones (${project_root:}) outside the command line.
hydra_setup.register()


@pytest.fixture
def real_mnist_dir() -> Path:
    data_dir = real_data_dir()
    if not has_real_mnist(data_dir):
        pytest.skip(f"real MNIST not found in {data_dir}/MNIST/raw, plain or .gz (set CAPSEXP_DATA_DIR)")
    return data_dir


@pytest.fixture
def mnist_dir(tmp_path: Path) -> Path:
    """A data_dir holding small synthetic MNIST .gz files (300 train, 100 test)."""
    return write_mnist(tmp_path / "data")


@pytest.fixture
def norb_dir(tmp_path: Path) -> Path:
    """A data_dir holding small smallNORB files in the official format (108 pairs per split)."""
    return write_norb(tmp_path / "data")


@pytest.fixture
def colour_folder(tmp_path: Path) -> Path:
    """An image folder of three classes of RGB images (20 each), told apart by their colour."""
    return write_image_folder(tmp_path / "images")


@pytest.fixture
def colour_folder_of(request: pytest.FixtureRequest):
    """The colour_folder fixture, made only when a test asks for it (data=image_folder)."""
    return lambda: request.getfixturevalue("colour_folder")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` run only where CUDA is available."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
