"""Checks of whole runs, for a routing package's tests: :func:`assert_trains` (the routing trains in
capsexp's nets from the command line) on :func:`write_synthetic_mnist`'s files, and
:func:`assert_page_rebuilds` (a results page written again from its kept runs, byte for byte)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def assert_page_rebuilds(page: Path, scratch: Path) -> None:
    """A results page (``python -m capsexp.compare ... --keep-runs``) as a reader checks it: its runs kept in
    ``page/runs`` copied into ``scratch`` and the page written again there from them alone, every file of the
    page (README, table, figures) the same bytes, its kept verdicts the same."""
    from capsexp.records.verdicts import VERDICTS
    from capsexp.results.compare import compare

    shutil.copytree(page / "runs", scratch / "runs")
    compare(scratch / "runs", scratch)
    written = sorted(p.name for p in scratch.iterdir() if p.is_file())
    assert written == sorted(p.name for p in page.iterdir() if p.is_file())
    for file in written:
        if file == VERDICTS:  # names the page by where it is, which the copy is not
            rebuilt, committed = (json.loads((folder / file).read_text()) for folder in (scratch, page))
            assert {**rebuilt, "page": committed["page"]} == committed, file
            continue
        assert (scratch / file).read_bytes() == (page / file).read_bytes(), file


def synthetic_digits(count: int, seed: int, size: int = 28) -> tuple[np.ndarray, np.ndarray]:
    """Easy, learnable "digits" as uint8 (count, size, size) and their labels: class k lights a 6x6 block at a
    place of its own, on noise."""
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % 10
    rng.shuffle(labels)
    images = rng.integers(0, 40, size=(count, size, size), dtype=np.uint8)
    for k in range(10):
        row, col = 3 + 7 * (k // 4), 3 + 7 * (k % 4)
        images[labels == k, row : row + 6, col : col + 6] = 220
    return images, labels.astype(np.uint8)


def write_synthetic_mnist(
    root: Path, train: int = 300, test: int = 100, gz: bool = True, folder: str = "MNIST"
) -> Path:
    """MNIST's four official IDX files (``root/<folder>/raw/``, torchvision's layout), holding
    :func:`synthetic_digits`: ``paths.data_dir=<root> data.verify_checksums=false`` reads them."""
    from capsexp.data.mnist import UNPACKED_MD5, write_idx

    raw = Path(root) / folder / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    data = {"train": synthetic_digits(train, seed=0), "t10k": synthetic_digits(test, seed=1)}
    for name in UNPACKED_MD5:
        images, labels = data[name.split("-")[0]]
        write_idx(raw / (name + (".gz" if gz else "")), images if "images" in name else labels)
    return Path(root)


def assert_trains(model: str, routing: str, scratch: Path, steps: int = 4, overrides: Sequence[str] = ()) -> Path:
    """``python -m capsexp model=<model> model/routing=<routing>`` run as a user runs it, in a new process in
    ``scratch``, on synthetic digits in MNIST's files, for ``steps`` steps, validated at the end: it must
    exit 0, build ``routing``'s router in the net, and log a finite training loss and a validation accuracy.
    Returns the run's folder (its checkpoints, events, card)."""
    from capsexp.records.events import read_scalars

    scratch = Path(scratch)
    data, run = write_synthetic_mnist(scratch / "data", train=200, test=40), scratch / "run"
    command = [
        sys.executable, "-m", "capsexp", f"model={model}", f"model/routing={routing}", "data=mnist",
        f"paths.data_dir={data}", "data.verify_checksums=false", "data.batch_size=16", "data.val_size=32",
        f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}", "trainer.accelerator=cpu",
        "trainer.log_every_n_steps=1", "test=false", "callbacks.progress_bar=null", f"hydra.run.dir={run}",
        *overrides,
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=scratch, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"}
    )
    shown = " ".join(command[1:])
    assert done.returncode == 0, f"python {shown} exited {done.returncode}:\n{done.stderr[-3000:]}"
    assert f"model/routing={routing}" in (run / ".hydra" / "overrides.yaml").read_text(), f"{shown}: not recorded"
    _assert_logged_training(read_scalars(run), shown)
    return run


def _assert_logged_training(series: dict, shown: str) -> None:
    """Every logged training loss finite (a loss that turns NaN after its first steps fails), and a
    validation accuracy logged."""
    losses = [value for _, value in series.get("train/loss_step", [])]
    assert losses and all(math.isfinite(v) for v in losses), f"{shown}: the training loss {losses}"
    assert "val/acc" in series, f"{shown}: no val/acc logged (tags: {sorted(series)})"
