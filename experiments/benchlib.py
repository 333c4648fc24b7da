"""What the benchmark scripts share: the machine's name, and a CLI run whose test accuracy is read back."""

from __future__ import annotations

import datetime
import platform
import subprocess
import sys
import time
from pathlib import Path

from capsexp import PROJECT_ROOT


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


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
    start = time.perf_counter()
    subprocess.run(command, cwd=PROJECT_ROOT, check=True)
    wall = time.perf_counter() - start
    return {"test_acc": last_scalar(run_dir, "test/acc"), "wall_s": wall}


def last_scalar(run_dir: Path, tag: str) -> float:
    """The last value of ``tag`` in a run's TensorBoard event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return events.Scalars(tag)[-1].value
