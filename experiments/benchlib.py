"""What the benchmark scripts share: a CLI run whose test accuracy is read back."""

from __future__ import annotations

import datetime
import subprocess
import sys
from pathlib import Path

from capsexp.records.events import last_scalar
from capsexp.records.metric_names import TEST_ACC
from timing import Stopwatch

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the checkout (experiments/ run only there)


def cli_test_accuracy(overrides: list[str], task: str, data_dir: str | None = None) -> dict[str, float]:
    """Run ``python -m capsexp <overrides>`` (train, then test); return its test/acc and wall time."""
    run_dir = PROJECT_ROOT / "logs" / task / datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    command = [
        sys.executable,
        "-m",
        "capsexp",
        *overrides,
        "callbacks.progress_bar=null",
        f"hydra.run.dir={run_dir}",
    ] + ([f"paths.data_dir={data_dir}"] if data_dir else [])
    with Stopwatch() as watch:
        subprocess.run(command, cwd=PROJECT_ROOT, check=True)
    return {"test_acc": last_scalar(run_dir, TEST_ACC), "wall_s": watch.seconds}
