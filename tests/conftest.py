"""Shared fixtures: synthetic datasets written in the real file formats, and config composition."""

from __future__ import annotations

import gzip
import os
import struct
import subprocess
import sys
from pathlib import Path

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one pytest worker per core (pytest-xdist): one thread each, for the worker
    # and the CLI runs it starts, instead of every process using every core.
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = "1"

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from capsexp import CONFIG_DIR, PROJECT_ROOT

MNIST_FILES = {
    "train-images-idx3-ubyte": ("images", True),
    "train-labels-idx1-ubyte": ("labels", True),
    "t10k-images-idx3-ubyte": ("images", False),
    "t10k-labels-idx1-ubyte": ("labels", False),
}


def write_idx(path: Path, array: np.ndarray, gz: bool = True) -> Path:
    """Write a uint8 array in the IDX format (big-endian header, then raw bytes), gzipped or not."""
    magic = 0x0800 | array.ndim
    payload = struct.pack(f">{1 + array.ndim}i", magic, *array.shape) + array.astype(np.uint8).tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(payload))
    else:
        path.write_bytes(payload)
    return path


def synthetic_digits(count: int, seed: int, size: int = 28) -> tuple[np.ndarray, np.ndarray]:
    """Easy, learnable 'digits': class k lights a 6x6 block at a class-specific place, plus noise."""
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % 10
    rng.shuffle(labels)
    images = rng.integers(0, 40, size=(count, size, size), dtype=np.uint8)
    for k in range(10):
        row, col = 3 + 7 * (k // 4), 3 + 7 * (k % 4)
        images[labels == k, row : row + 6, col : col + 6] = 220
    return images, labels.astype(np.uint8)


def write_mnist(root: Path, train: int = 300, test: int = 100, gz: bool = True) -> Path:
    """Write the four MNIST IDX files, with synthetic content, into ``root/MNIST/raw``."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    data = {True: synthetic_digits(train, seed=0), False: synthetic_digits(test, seed=1)}
    for name, (kind, is_train) in MNIST_FILES.items():
        images, labels = data[is_train]
        write_idx(raw / name, images if kind == "images" else labels, gz=gz)
    return root


def real_data_dir() -> Path:
    """Where the real datasets are: $CAPSEXP_DATA_DIR, else ../shared/data beside the checkout."""
    return Path(os.environ.get("CAPSEXP_DATA_DIR", PROJECT_ROOT.parent / "shared" / "data")).resolve()


@pytest.fixture
def real_mnist_dir() -> Path:
    data_dir = real_data_dir()
    if not (data_dir / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz").exists():
        pytest.skip(f"real MNIST not found in {data_dir}/MNIST/raw (set CAPSEXP_DATA_DIR)")
    return data_dir


@pytest.fixture
def mnist_dir(tmp_path: Path) -> Path:
    """A data_dir holding small synthetic MNIST .gz files (300 train, 100 test)."""
    return write_mnist(tmp_path / "data")


def compose_config(overrides: list[str] | None = None, output_dir: Path | None = None) -> DictConfig:
    """Compose conf/config.yaml as the CLI would, with ``paths.output_dir`` set (no Hydra run)."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides or [])
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir or "/tmp/capsexp-test-output")
    return cfg


def run_cli(*overrides: str, timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m capsexp`` in a subprocess from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "capsexp", *overrides],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})},
    )


# Overrides for a tiny, fast CLI run on synthetic data.
TINY_RUN = [
    "data.batch_size=20",
    "data.val_size=60",
    "data.verify_checksums=false",
    "trainer.accelerator=cpu",
    "trainer.log_every_n_steps=1",
    "trainer.val_check_interval=1.0",
    "callbacks.progress_bar=null",
    "callbacks.model_summary=null",
]


def scalars(run_dir: Path) -> dict[str, list]:
    """Every scalar series in ``run_dir/tensorboard``: tag -> [ScalarEvent(step, value, ...)]."""
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return {tag: events.Scalars(tag) for tag in events.Tags()["scalars"]}


def hparams_summary(run_dir: Path) -> dict[str, dict]:
    """What TensorBoard's HParams tab reads from ``run_dir/tensorboard``: hyperparameters, metric tags."""
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    content = events.PluginTagToContent("hparams")
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = {}
    for name, value in session.session_start_info.hparams.items():
        kind = value.WhichOneof("kind")
        hparams[name] = getattr(value, kind)
    return {"hparams": hparams, "metrics": [info.name.tag for info in experiment.metric_infos]}
