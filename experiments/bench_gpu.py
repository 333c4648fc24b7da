"""GPU benchmark: training images/s, time per epoch and peak GPU memory through ``python -m capsexp``.

    python experiments/bench_gpu.py                 # on a GPU machine (make bench-gpu)
    python experiments/bench_gpu.py --smoke         # the same code path on the CPU, tiny, for the tests

Every measurement is one run of the CLI, the Lightning loop users run (data on the device, the
optimizer, logging, checkpoints): LeNet5 and CapsNet (with decoder) on MNIST at batch 128, em_caps on
smallNORB-shaped 2x32x32 inputs at batch 32 and 64, each in fp32 (TF32 matmuls) and bf16-mixed,
eager and compiled (``model.compile=true``). Each run trains 2 epochs without validation; the table
gives the second epoch (the first includes compilation and warm-up) from the ``EpochTimer``
callback's ``perf/train_epoch_s``, ``perf/train_images_per_s`` and ``perf/peak_memory_gib``.

smallNORB cannot be downloaded on an offline machine: where ``<data dir>/smallnorb`` is missing, a
synthetic set of the official size (24,300 training pairs) is written in the official format into a
temporary folder and read with ``data.verify_checksums=false``; timings do not depend on the pixels.
Writes experiments/results/bench_gpu.md (``--output`` to change).
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from capsexp.records.events import read_scalars
from capsexp.records.machine import cpu_name
from timing import Stopwatch

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the checkout (experiments/ run only there)

MNIST = ["data=mnist", "data.batch_size=128"]
RUNS = {
    # name: overrides
    "LeNet5, MNIST, batch 128": ["model=lenet5", *MNIST],
    "CapsNet, MNIST, batch 128": ["model=capsnet", *MNIST],
    "em_caps, 2x32x32, batch 32": ["model=em_caps", "data=smallnorb", "data.batch_size=32"],
    "em_caps, 2x32x32, batch 64": ["model=em_caps", "data=smallnorb", "data.batch_size=64"],
}
PRECISIONS = {
    "fp32 (TF32)": ["trainer.precision=32-true", "float32_matmul_precision=high"],
    "bf16-mixed": ["trainer.precision=bf16-mixed"],
}
COMPILE = {"eager": ["model.compile=false"], "compiled": ["model.compile=true"]}
COMMON = [
    "trainer.max_epochs=2",
    "trainer.limit_val_batches=0",
    "test=false",
    "seed=1",
    "callbacks.progress_bar=null",
    "callbacks.model_summary=null",
    "callbacks.model_checkpoint=null",
    "callbacks.reconstructions=null",
    "callbacks.routing_diagnostics=null",
    "task_name=bench_gpu",
]
# --smoke: the same runs, tiny, on the CPU (the tests run it).
SMOKE = ["trainer.accelerator=cpu", "trainer.limit_train_batches=3", "data.val_size=60", "model.compile=false"]
SMOKE_NETS = {
    "model=capsnet": ["model.net.conv_channels=16", "model.net.primary_types=4"],
    "model=em_caps": [
        "model.net.conv_channels=8",
        "model.net.primary_types=4",
        "model.net.conv_caps1_types=4",
        "model.net.conv_caps2_types=4",
    ],
}


def write_synthetic_smallnorb(root: Path, train: int = 24300, test: int = 24300) -> Path:
    """The six smallNORB files in the official format, random pixels, official sizes by default."""
    from capsexp.data.norb_format import write_matrix

    folder = root / "smallnorb"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for prefix, count in (
        ("smallnorb-5x46789x9x18x6x2x96x96-training", train),
        ("smallnorb-5x01235x9x18x6x2x96x96-testing", test),
    ):
        write_matrix(folder / f"{prefix}-dat.mat", rng.integers(0, 256, (count, 2, 96, 96), dtype=np.uint8))
        write_matrix(folder / f"{prefix}-cat.mat", (np.arange(count) % 5).astype(np.int32))
        info = np.stack(
            [np.arange(count) % 10, np.arange(count) % 9, 2 * (np.arange(count) % 18), np.arange(count) % 6], axis=1
        ).astype(np.int32)
        write_matrix(folder / f"{prefix}-info.mat", info)
    return root


def second_epoch(run_dir: Path) -> dict[str, float]:
    values = {
        tag.removeprefix("perf/"): [value for _, value in series]
        for tag, series in read_scalars(run_dir).items()
        if tag.startswith("perf/")
    }
    return {name: series[-1] for name, series in values.items()} | {
        "first_epoch_s": values.get("train_epoch_s", [float("nan")])[0]
    }


def run(name: str, overrides: list[str], args: argparse.Namespace, norb_dir: Path | None) -> dict[str, float]:
    run_dir = args.log_dir / "bench_gpu" / datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S-%f")
    data = (
        [f"data.data_dir={norb_dir}", "data.verify_checksums=false"]
        if norb_dir and "data=smallnorb" in overrides
        else []
    )
    command = [sys.executable, "-m", "capsexp", *overrides, *COMMON, *data, f"hydra.run.dir={run_dir}"]
    if args.smoke:
        command += SMOKE + [o for key, extra in SMOKE_NETS.items() if key in overrides for o in extra]
    print(f"\n=== {name}: {' '.join(command[3:])}", flush=True)
    with Stopwatch() as watch:
        result = subprocess.run(command, cwd=PROJECT_ROOT, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if result.returncode:
        return {"failed": float(result.returncode)}
    return second_epoch(run_dir) | {"wall_s": watch.seconds}


def device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} ({torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB)"
    return f"no GPU: {cpu_name()}, {os.cpu_count()} cores"


def table(results: list[tuple[str, str, str, dict[str, float]]]) -> str:
    lines = [
        "| run | precision | mode | epoch (s, 2nd) | images/s | first epoch (s) | peak GPU memory (GiB) |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for name, precision, mode, values in results:
        if "failed" in values:
            lines.append(f"| {name} | {precision} | {mode} | failed (exit {values['failed']:.0f}) | | | |")
            continue
        memory = f"{values['peak_memory_gib']:.2f}" if "peak_memory_gib" in values else ""
        lines.append(
            f"| {name} | {precision} | {mode} | {values.get('train_epoch_s', float('nan')):.2f} | "
            f"{values.get('train_images_per_s', float('nan')):,.0f} | "
            f"{values.get('first_epoch_s', float('nan')):.2f} | {memory} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny runs on the CPU (checks the code path)")
    parser.add_argument("--output", type=Path, default=PROJECT_ROOT / "experiments" / "results" / "bench_gpu.md")
    parser.add_argument("--log-dir", type=Path, default=Path(os.environ.get("CAPSEXP_LOG_DIR", PROJECT_ROOT / "logs")))
    parser.add_argument("--only", nargs="+", choices=list(RUNS), metavar="RUN", help="measure only these runs")
    args = parser.parse_args(argv)
    args.log_dir = args.log_dir.resolve()

    data_dir = Path(os.environ.get("CAPSEXP_DATA_DIR", PROJECT_ROOT / "data"))
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        norb_dir = None
        if not (data_dir / "smallnorb").is_dir():
            count = 300 if args.smoke else 24300
            print(f"smallNORB not in {data_dir}: writing a synthetic set of {count:,} pairs in the official format")
            norb_dir = write_synthetic_smallnorb(Path(scratch), train=count, test=count if args.smoke else 100)
        for name, overrides in RUNS.items():
            if args.only and name not in args.only:
                continue
            for precision, precision_overrides in PRECISIONS.items():
                for mode, compile_overrides in COMPILE.items():
                    if args.smoke and mode == "compiled":
                        continue
                    values = run(
                        f"{name}, {precision}, {mode}",
                        [*overrides, *precision_overrides, *compile_overrides],
                        args,
                        norb_dir,
                    )
                    results.append((name, precision, mode, values))
    import torch

    page = "\n".join(
        [
            "# GPU benchmark" + (" (smoke run on the CPU)" if args.smoke else ""),
            "",
            f"Written by `experiments/bench_gpu.py` on {datetime.date.today().isoformat()}: {device_name()}, "
            f"torch {torch.__version__}.",
            "",
            "Each row is one `python -m capsexp` run of 2 epochs without validation; the epoch time is the "
            "second epoch's training time (`perf/train_epoch_s`), the first includes compilation and warm-up. "
            "MNIST epochs are 55,000 images; em_caps epochs 23,300 (smallNORB's training set less 1,000 for "
            "validation).",
            "",
            table(results),
        ]
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(page)
    print(f"\nResults: {args.output}")
    return 0 if all("failed" not in values for *_, values in results) else 1


if __name__ == "__main__":
    sys.exit(main())
