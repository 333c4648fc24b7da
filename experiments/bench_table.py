"""Every model and routing's throughput in the field's format; writes
experiments/results/benchmark-<device>-<precision>.csv.

timm keeps one benchmark CSV per device, torch version and precision; this is the capsule models' own. One row
per model config (and, for CapsNet's models, per routing of ``model/routing``): training and inference
samples/s, the training step's time, parameters, forward GMACs (a multiply-add each, as timm counts them),
the peak memory a training step adds, and where it ran. Each row is measured in a fresh process (its peak
memory its own): a training step as a run makes it (forward, the model's objective, backward, the config's
optimizer; under ``torch.autocast`` to bf16 where the precision is bf16-mixed, as Lightning runs it), on
MNIST-shaped batches of random images (a step's cost does not depend on their content).

    python experiments/bench_table.py                          # this CPU: float32, then trainer.precision=auto
    python experiments/bench_table.py --device cuda            # a GPU (make bench-gpu): its own files
    python experiments/bench_table.py --models lenet5 --precisions float32   # one row, one file
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"
# The models of conf/model/ measured, and which of them take a routing (CapsNet's DigitCaps).
MODELS = ("lenet5", "baseline_cnn", "capsnet_small", "capsnet", "em_caps_small", "em_caps", "vb_caps")
ROUTED = ("capsnet_small", "capsnet")
PRECISIONS = ("float32", "auto")  # float32: 32-true; auto: what trainer.precision=auto trains in, per model
COLUMNS = (
    "model",
    "routing",
    "data",
    "img_size",
    "batch_size",
    "train_samples_per_sec",
    "infer_samples_per_sec",
    "train_step_time_ms",
    "param_count",
    "gmacs",
    "peak_memory_mib",
    "precision",
    "torch_version",
    "device",
    "threads",
)
WARMUP = 2


def worker(model: str, routing: str | None, precision: str, device: str, batch: int, steps: int) -> dict:
    """In this process: one row."""
    import torch
    from hydra.utils import instantiate

    from capsexp.config.hydra_setup import compose
    from capsexp.config.instantiation import build_model
    from capsexp.config.precision import BF16, FLOAT32, resolve, routing_of
    from capsexp.run.model_cost import forward_flops_per_image, parameter_count

    overrides = [f"model={model}", "data=mnist", f"data.batch_size={batch}"]
    overrides += [f"model/routing={routing}"] if routing else []
    cfg = compose(overrides)
    chosen = FLOAT32 if precision == "float32" else resolve("auto", model, routing_of(cfg.model), device).lightning
    torch.manual_seed(0)
    module = build_model("model", cfg.model).to(device)
    optimizer = instantiate(cfg.model.optimizer)(module.parameters())
    size, channels = cfg.geometry.image_size, cfg.geometry.channels
    images = torch.rand(batch, channels, size, size, device=device)
    targets = torch.randint(0, cfg.geometry.num_classes, (batch,), device=device)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=chosen == BF16)

    def synchronise() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    def train_step() -> None:
        with autocast:
            output = module(images, targets)
            loss = module.objective(output, images, targets)["loss"]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def timed(step) -> float:
        synchronise()
        started = time.perf_counter()
        step()
        synchronise()
        return time.perf_counter() - started

    memory_before = _memory_mib(device, reset=True)
    module.train()
    train = [timed(train_step) for _ in range(WARMUP + steps)][WARMUP:]
    peak = _memory_mib(device, peak=True) - memory_before
    module.eval()
    with torch.no_grad():

        def infer() -> None:
            with autocast:
                module(images)

        infer_times = [timed(infer) for _ in range(WARMUP + steps)][WARMUP:]
    step_s, infer_s = statistics.median(train), statistics.median(infer_times)
    return {
        "model": model,
        "routing": routing or "",
        "data": "mnist",
        "img_size": size,
        "batch_size": batch,
        "train_samples_per_sec": round(batch / step_s, 2),
        "infer_samples_per_sec": round(batch / infer_s, 2),
        "train_step_time_ms": round(1000 * step_s, 2),
        "param_count": parameter_count(module.net),
        "gmacs": round(forward_flops_per_image(module, channels, size) / 2e9, 4),
        "peak_memory_mib": round(peak, 1),
        "precision": chosen,
        "torch_version": torch.__version__.split("+")[0],
        "device": _device_name(device),
        "threads": torch.get_num_threads() if device == "cpu" else "",
    }


def _memory_mib(device: str, reset: bool = False, peak: bool = False) -> float:
    """On the CPU the resident set (its peak since the reset: /proc/self/status VmHWM, reset by writing 5
    to clear_refs); on a GPU the memory torch allocated."""
    import torch

    if device == "cuda":
        if reset:
            torch.cuda.reset_peak_memory_stats()
        return (torch.cuda.max_memory_allocated() if peak else torch.cuda.memory_allocated()) / 2**20
    if reset:
        Path("/proc/self/clear_refs").write_text("5")
    field = "VmHWM" if peak else "VmRSS"
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def _device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name()
    from capsexp.records.machine import cpu_name

    return cpu_name()


def rows_to_run(models: list[str], routings: list[str] | None) -> list[tuple[str, str | None]]:
    from capsexp.config.hydra_setup import ROUTINGS

    found = []
    for model in models:
        if model in ROUTED:
            found += [(model, routing) for routing in routings or ROUTINGS if not routing.startswith("em")]
        else:
            found.append((model, None))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--routings", nargs="+", help="of the routed models (default: every one but EM's)")
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per row (after the warm-up)")
    parser.add_argument("--worker", nargs=3, metavar=("MODEL", "ROUTING", "PRECISION"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        model, routing, precision = args.worker
        print(json.dumps(worker(model, routing or None, precision, args.device, args.batch, args.steps)))
        return
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device here; a GPU's rows are written on a machine that has one")
    device = "cpu" if args.device == "cpu" else "gpu"
    for precision in args.precisions:
        path = RESULTS_DIR / f"benchmark-{device}-{precision}.csv"
        rows = []
        for model, routing in rows_to_run(args.models, args.routings):
            command = [sys.executable, __file__, "--worker", model, routing or "", precision]
            command += ["--device", args.device, "--batch", str(args.batch), "--steps", str(args.steps)]
            done = subprocess.run(
                command, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"}
            )
            if done.returncode != 0:
                sys.exit(f"{model} {routing or ''} ({precision}) failed:\n{done.stderr[-3000:]}")
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"{precision} {model} {routing or ''}: {rows[-1]['train_step_time_ms']} ms", flush=True)
        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
        print(path.relative_to(RESULTS_DIR.parents[1]))


if __name__ == "__main__":
    main()
