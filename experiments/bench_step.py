"""A training step at each tree's default settings, against the code of a git revision; writes
experiments/results/bench_step.md.

A step is what ``python -m capsexp model=<model> data=mnist`` trains: Lightning's ``Trainer.fit`` of the
LightningModule the config builds, at the precision ``trainer.precision`` gives (``auto`` resolved as a run
resolves it), with the config's optimizer, on MNIST-shaped batches of random images (a step's cost does
not depend on their content). No validation, logger, checkpoint or progress bar: those are not the step.

Each tree runs in processes of its own (the revision's ``src/`` and ``conf/`` from ``git archive``), one
after the other, in alternating order (this tree first, then the revision's, then the revision's first):
a pair is one process of each, its ratio this tree's median step over the revision's. The page gives the
median ratio over the pairs and its quartiles, so that the shared machine's drift hits both trees alike.

    python experiments/bench_step.py --baseline 863d22d --baseline-name "before the speed work"
    python experiments/bench_step.py --models capsnet_small --pairs 9 --baseline 863d22d
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"
RESULTS = RESULTS_DIR / "bench_step.md"
MODELS = ("capsnet_small", "capsnet")
WARMUP = 3  # steps before timing: the first ones allocate buffers and tune oneDNN's kernels


def worker(tree: Path, model: str, batch: int, steps: int) -> dict:
    """In this process: the step times of ``model`` as the tree at ``tree`` builds and trains it."""
    sys.path.insert(0, str(tree / "src"))
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from capsexp.config.hydra_setup import compose
    from capsexp.run.build import build_model

    cfg = compose([f"model={model}", "data=mnist", f"data.batch_size={batch}", "trainer=cpu"])
    try:  # the trees that have trainer.precision=auto resolve it as their runs do
        from capsexp.config.precision import resolve

        precision = resolve(cfg.trainer.precision, cfg.model.net._target_, "cpu").lightning
    except ImportError:
        precision = str(cfg.trainer.precision)
    torch.manual_seed(0)
    module = build_model("model", cfg.model)
    times: list[float] = []

    class Timer(L.Callback):
        def on_train_batch_start(self, *args) -> None:
            self.started = time.perf_counter()

        def on_train_batch_end(self, *args) -> None:
            times.append(time.perf_counter() - self.started)

    images = torch.rand(batch * (WARMUP + steps), 1, 28, 28)
    labels = torch.randint(0, 10, (len(images),))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        precision=precision,
        max_steps=WARMUP + steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Timer()],
    )
    trainer.fit(module, DataLoader(TensorDataset(images, labels), batch_size=batch))
    return {"precision": precision, "step_s": statistics.median(times[WARMUP:])}


def tree_at(revision: str) -> Path:
    """``src/`` and ``conf/`` as they are at a git revision, in a temporary folder."""
    root = Path(__file__).resolve().parents[1]
    archive = subprocess.run(["git", "archive", revision, "src", "conf"], cwd=root, capture_output=True)
    if archive.returncode != 0:
        sys.exit(f"--baseline {revision}: git cannot show src/ and conf/ there: {archive.stderr.decode().strip()}")
    folder = Path(tempfile.mkdtemp(prefix="bench_step_"))
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as files:
        files.extractall(folder, filter="data")
    return folder


def run_worker(tree: Path, model: str, args: argparse.Namespace) -> dict:
    """One worker process; its result."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, __file__, "--worker", str(tree), "--models", model]
    command += ["--batch", str(args.batch), "--steps", str(args.steps)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the worker of {model} at {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def quartiles(values: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="863d22d", help="the git revision to compare against")
    parser.add_argument("--baseline-name", default="the revision before the speed work")
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per process (after the warm-up)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.models[0], args.batch, args.steps)))
        return

    here, there = Path(__file__).resolve().parents[1], tree_at(args.baseline)
    load = os.getloadavg()[0]
    rows = []
    for model in args.models:
        ours, theirs = [], []
        for pair in range(args.pairs):
            trees = [(here, ours), (there, theirs)]
            for tree, results in trees if pair % 2 == 0 else trees[::-1]:
                results.append(run_worker(tree, model, args))
            print(f"{model} pair {pair + 1}: {ours[-1]['step_s'] / theirs[-1]['step_s']:.3f}", flush=True)
        ratios = [a["step_s"] / b["step_s"] for a, b in zip(ours, theirs, strict=True)]
        rows.append(
            {
                "model": model,
                "precision": ours[0]["precision"],
                "baseline_precision": theirs[0]["precision"],
                "step_ms": 1000 * statistics.median(r["step_s"] for r in ours),
                "baseline_step_ms": 1000 * statistics.median(r["step_s"] for r in theirs),
                "ratio": statistics.median(ratios),
                "quartiles": quartiles(ratios),
                "ratios": ratios,
            }
        )
    write(rows, args, load)


def write(rows: list[dict], args: argparse.Namespace, load: float) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import torch

    from capsexp.results.machine import cpu_name

    options = [f"--models {' '.join(args.models)}", f"--pairs {args.pairs}", f"--steps {args.steps}"]
    options += [f"--batch {args.batch}", f"--threads {args.threads}", "--baseline REV"]
    command = "python experiments/bench_step.py " + " ".join(options)
    lines = [
        "# A training step at the default settings, against the code before the speed work",
        "",
        f"- Machine: {cpu_name()}, {args.threads} torch thread{'s' if args.threads > 1 else ''}, CPU only, "
        f"torch {torch.__version__.split('+')[0]}, Python {platform.python_version()}; load average over the "
        f"minute before: {load:.2f} (0 on an idle machine).",
        f"- Date: {datetime.date.today().isoformat()}.",
        f"- Command: `{command}`, REV being {args.baseline_name}.",
        "",
        "A step: Lightning's `Trainer.fit` of `python -m capsexp model=<model> data=mnist`'s LightningModule, "
        f"batch {args.batch} of 1x28x28 images, at the precision `trainer.precision` gives in each tree "
        "(`auto` resolved as a run resolves it), with the config's optimizer; no validation, logging or "
        f"checkpoints. Each tree in processes of its own, {args.pairs} pairs in alternating order, each process "
        f"timing {args.steps} steps after {WARMUP} of warm-up (its median); the ratio is this tree's step over "
        "REV's in the same pair, its median and quartiles over the pairs.",
        "",
        "| model | precision | step | REV's precision | REV's step | ratio (median) | quartiles of the ratio |",
        "| --- | --- | ---: | --- | ---: | ---: | --- |",
    ]
    for row in rows:
        low, high = row["quartiles"]
        lines.append(
            f"| model={row['model']} | {row['precision']} | {row['step_ms']:.1f} ms | {row['baseline_precision']} "
            f"| {row['baseline_step_ms']:.1f} ms | {row['ratio']:.2f}x | {low:.2f}x to {high:.2f}x |"
        )
    RESULTS.write_text("\n".join(lines) + "\n")
    (RESULTS_DIR / "bench_step.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(RESULTS.relative_to(RESULTS_DIR.parents[1]))


if __name__ == "__main__":
    main()
