"""What the tests share: synthetic datasets written in the real file formats, config composition as
the CLI does it, CLI runs, TensorBoard read-back, and a stand-in for the Trainer a DataModule reads."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, open_dict
from tensorboard.plugins.hparams import plugin_data_pb2

from capsexp.config.hydra_setup import compose
from capsexp.data import mnist
from capsexp.data.norb_format import write_matrix
from capsexp.data.smallnorb import PREFIX
from capsexp.records.events import Scalar, load_events, read_scalars
from capsexp.testing import synthetic_digits, write_synthetic_mnist  # noqa: F401  (synthetic_digits: the tests')

# The checkout the tests run in (or mutmut's copy of it, mutants/).
PROJECT_ROOT = Path(__file__).resolve().parents[1]

MNIST_FILES = {
    "train-images-idx3-ubyte": ("images", True),
    "train-labels-idx1-ubyte": ("labels", True),
    "t10k-images-idx3-ubyte": ("images", False),
    "t10k-labels-idx1-ubyte": ("labels", False),
}


def write_idx(path: Path, array: np.ndarray, gz: bool = True) -> Path:
    """Write a uint8 array in the IDX format, gzipped (``<path>.gz``) or not."""
    return mnist.write_idx(path.with_name(path.name + ".gz") if gz else path, array)


def write_mnist(root: Path, train: int = 300, test: int = 100, gz: bool = True, folder: str = "MNIST") -> Path:
    """Write the four MNIST IDX files, with synthetic content (:func:`capsexp.testing.synthetic_digits`), into
    ``root/<folder>/raw`` (``FashionMNIST``: Fashion-MNIST's files, in the same format)."""
    return write_synthetic_mnist(root, train, test, gz, folder)


def real_data_dir() -> Path:
    """Where the real datasets are: $CAPSEXP_DATA_DIR, else shared/data beside the checkout (or beside a
    folder holding it: mutmut runs the tests from a copy in mutants/)."""
    if "CAPSEXP_DATA_DIR" in os.environ:
        return Path(os.environ["CAPSEXP_DATA_DIR"]).resolve()
    for folder in PROJECT_ROOT.resolve().parents:
        if (folder / "shared" / "data").is_dir():
            return folder / "shared" / "data"
    return PROJECT_ROOT.parent / "shared" / "data"


def has_real_mnist(data_dir: Path) -> bool:
    """Whether ``data_dir`` holds the four official MNIST files in ``MNIST/raw/``, each plain or ``.gz`` (as
    the DataModule reads them)."""
    from capsexp.data.mnist import UNPACKED_MD5

    raw = data_dir / "MNIST" / "raw"
    return all((raw / name).exists() or (raw / f"{name}.gz").exists() for name in UNPACKED_MD5)


def compose_config(overrides: list[str] | None = None, output_dir: Path | None = None) -> DictConfig:
    """Compose conf/config.yaml as the CLI would, with ``paths.output_dir`` set (no Hydra run)."""
    cfg = compose(overrides or [])
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir or "/tmp/capsexp-test-output")
    return cfg


def required_choices(experiment: str) -> list[str]:
    """What a test gives an experiment that needs groups chosen (``requires: [routing]``): ``+routing=dynamic``."""
    from omegaconf import OmegaConf

    from capsexp.locations import CONFIG_DIR

    needed = OmegaConf.load(CONFIG_DIR / "experiment" / f"{experiment}.yaml").get("requires") or []
    return [f"+{group}=dynamic" for group in needed]


def saved_run(folder: Path, overrides: str) -> Path:
    """A run folder as a training run leaves one: ``.hydra/overrides.yaml`` (``overrides``: its YAML list)
    and a saved state, ``checkpoints/last.ckpt``."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(overrides)
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "last.ckpt").write_bytes(b"state")
    return folder


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


def two_step_run(run_dir: Path, *overrides: str) -> dict:
    """``python -m capsexp <overrides>`` in this process for two training steps, validated after the
    second, then tested, writing into ``run_dir``: it must exit 0; its logged scalars."""
    result = run_cli_in_process(
        *overrides, "trainer.max_steps=2", "trainer.val_check_interval=2", f"hydra.run.dir={run_dir}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return scalars(run_dir)


def run_cli_in_process(*overrides: str, entry: Callable[[], None] | None = None) -> subprocess.CompletedProcess:
    """``python -m capsexp`` (or another command line's ``entry``, e.g. ``capsexp.predict.main``) run in
    this process, training included: what it prints and its exit status,
    as :func:`run_cli` gives them, without the seconds a new process spends importing torch and
    Lightning. What a run changes in its process is put back afterwards: Hydra's global state, the root
    logger, the environment (the seed Lightning exports), signal handlers, torch's thread count and
    float32 matmul precision. :func:`run_cli` remains for what needs a process of its own: DDP, signals
    sent to a run, launchers."""
    import contextlib
    import io
    import logging
    import signal

    from hydra.core.global_hydra import GlobalHydra

    from capsexp.__main__ import cli

    stdout, stderr = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    handlers, level, argv, environment = list(root.handlers), root.level, sys.argv, dict(os.environ)
    signals = [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1]
    signal_handlers = {signum: signal.getsignal(signum) for signum in signals}
    threads, precision = torch.get_num_threads(), torch.get_float32_matmul_precision()
    sys.argv = ["capsexp", *overrides]
    returncode = 0
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            (entry or cli)()
    except SystemExit as stop:  # sys.exit(status) as the process would exit
        returncode = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        sys.argv = argv
        GlobalHydra.instance().clear()
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()  # the run's log file
        root.handlers[:] = handlers
        root.setLevel(level)
        os.environ.clear()
        os.environ.update(environment)
        for signum, handler in signal_handlers.items():
            signal.signal(signum, handler)
        torch.set_num_threads(threads)
        torch.set_float32_matmul_precision(precision)
    return subprocess.CompletedProcess(["capsexp", *overrides], returncode, stdout.getvalue(), stderr.getvalue())


# Overrides for a tiny, fast CLI run on synthetic data.
EXAMPLE = PROJECT_ROOT / "examples" / "max_min_routing"  # the example routing package (make examples)


def example_routings() -> set[str]:
    """The routings the example package registers (its pyproject.toml's entry points)."""
    import tomllib

    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    return set(project["entry-points"]["capsexp.routing"])


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


# A tiny EM-capsule net (A=8, B=C=D=4) for CLI runs of model=em_caps or em_caps_small.
TINY_EM_CAPS = [
    "model.net.conv_channels=8",
    "model.net.primary_types=4",
    "model.net.conv_caps1_types=4",
    "model.net.conv_caps2_types=4",
]


def scalars(run_dir: Path) -> dict[str, list[Scalar]]:
    """Every scalar series of a run: tag -> [(step, value), ...]."""
    return read_scalars(run_dir)


def hparams_summary(run_dir: Path) -> dict[str, dict]:
    """What TensorBoard's HParams tab reads of a run served by ``python -m capsexp.tensorboard``: the
    run's session (its hyperparameters, in the columns' order) and the columns' metric tags, from the
    experiment summary that command writes over the run."""
    import tempfile

    from capsexp.tensorboard import write_columns

    with tempfile.TemporaryDirectory() as columns:
        write_columns([Path(run_dir)], Path(columns))
        experiment = plugin_data_pb2.HParamsPluginData.FromString(
            load_events(columns).PluginTagToContent("hparams")["_hparams_/experiment"]
        ).experiment
    content = load_events(run_dir).PluginTagToContent("hparams")
    assert "_hparams_/experiment" not in content  # a run's own would set every run's columns
    values = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    values = values.session_start_info.hparams
    hparams = {}
    for info in experiment.hparam_infos:  # the tab's column order (the session's map keeps none)
        value = values[info.name]
        hparams[info.name] = getattr(value, value.WhichOneof("kind"))
    return {"hparams": hparams, "metrics": [info.name.tag for info in experiment.metric_infos]}


# ---- smallNORB ---------------------------------------------------------------------------------------
NORB_COUNT = 108  # 18 azimuths x 6 elevations: every viewpoint appears


def norb_arrays(seed: int) -> dict[str, np.ndarray]:
    """One split's contents: images (2 views of 96x96), categories, info (instance, elevation, azimuth, lighting)."""
    rng = np.random.default_rng(seed)
    categories = (np.arange(NORB_COUNT) % 5).astype(np.int32)
    info = np.stack(
        [
            rng.integers(0, 10, NORB_COUNT),
            np.arange(NORB_COUNT) % 9,
            (np.arange(NORB_COUNT) % 18) * 2,
            rng.integers(0, 6, NORB_COUNT),
        ],
        axis=1,
    ).astype(np.int32)
    images = rng.integers(0, 60, size=(NORB_COUNT, 2, 96, 96), dtype=np.uint8)
    for k in range(5):  # a learnable bright block per category
        images[categories == k, :, 10 + 15 * k : 25 + 15 * k, 30:60] = 230
    return {"dat": images, "cat": categories, "info": info}


def write_norb(root: Path, gz: bool = True) -> Path:
    """The six files in <root>/smallnorb/, training files gzipped (if ``gz``), testing files plain."""
    folder = root / "smallnorb"
    folder.mkdir(parents=True, exist_ok=True)
    for seed, (split, prefix) in enumerate(PREFIX.items()):
        for kind, array in norb_arrays(seed).items():
            suffix = ".gz" if gz and split == "train" else ""
            write_matrix(folder / f"{prefix}-{kind}.mat{suffix}", array)
    return root


# ---- a Trainer, as a DataModule sees it ---------------------------------------------------------------
@dataclass
class FakeTrainer:
    """The attributes of a Lightning Trainer that a DataModule reads, to test one outside a run."""

    world_size: int = 1
    global_rank: int = 0
    global_step: int = 0
    training: bool = False
    testing: bool = False
    strategy: object = field(default_factory=lambda: FakeStrategy())


@dataclass
class FakeStrategy:
    root_device: torch.device = field(default_factory=lambda: torch.device("cpu"))


# The classes of write_image_folder's images, in the order ImageFolder numbers their folders.
COLOURS = ("blue", "green", "red")


def write_png(image: torch.Tensor, path: str | Path) -> None:
    """A (3, H, W) uint8 tensor as a PNG file."""
    from PIL import Image

    Image.fromarray(image.permute(1, 2, 0).numpy()).save(path)


def write_image_folder(folder: Path, per_class: int = 20, size: tuple[int, int] = (36, 40), seed: int = 0) -> Path:
    """An image folder (one sub-folder per class) of RGB PNGs of three classes told apart by their
    dominant colour channel: a separable task."""
    generator = torch.Generator().manual_seed(seed)
    for name in COLOURS:
        channel = {"red": 0, "green": 1, "blue": 2}[name]
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            image = (torch.rand(3, *size, generator=generator) * 60).to(torch.uint8)
            image[channel] += 150
            write_png(image, folder / name / f"{i:03d}.png")
    return folder


# Data configs whose input geometry another one has: the model x data products take one per geometry,
# as these build the same nets (fashion_mnist is mnist's 1x28x28, svhn cifar10's 3x32x32 of 10 classes).
SAME_GEOMETRY_AS = {"fashion_mnist": "mnist", "svhn": "cifar10"}


def data_overrides(data: str, colour_folder_of: Callable[[], Path]) -> list[str]:
    """What a data config needs on the command line beside its name: an image folder's root (colour
    images, 32x32; ``colour_folder_of`` makes it only when asked)."""
    if data != "image_folder":
        return []
    return [f"data.root={colour_folder_of()}", "data.channels=3", "data.image_size=32"]
