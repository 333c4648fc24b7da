"""A training step at the default settings against the code of a git revision, and each speed choice on
its own; writes experiments/results/bench_step.md (and bench_step.json).

A step is what ``python -m capsexp model=<model> data=mnist`` trains: Lightning's ``Trainer.fit`` of the
LightningModule the config builds, at the precision ``trainer.precision`` gives (``auto`` resolved as a run
resolves it), with the config's optimizer, on MNIST-shaped batches of random images (a step's cost does
not depend on their content). No validation, logger, checkpoint or progress bar: those are not the step.

Every variant runs in processes of its own, one after the other, round after round in an order that turns
each round, so that the shared machine's drift hits every variant alike; each process times ``--steps``
steps after a warm-up (their median). A variant's ratio is its step over the default's in the same round;
the page gives each variant's median ratio over the rounds and its quartiles.

- ``REV``: the default settings of the code at ``--baseline`` (its ``src/`` and ``conf/`` from ``git
  archive``): the speed work's whole effect;
- one choice undone at a time: ``trainer.precision=32-true`` (and ``bf16-mixed``, where ``auto`` keeps
  float32), ``model.optimizer.fused=false``, and choices not taken: channels-last memory format (the net
  and the batch), ``model.compile=true``;
- ``--votes-revision``'s code under bf16-mixed with its own (foreach) Adam, against this tree's under
  bf16-mixed with ``model.optimizer.fused=false``: what routing's float32 votes under autocast change.

    python experiments/bench_step.py                     # capsnet_small and capsnet, about 25 minutes
    python experiments/bench_step.py --models capsnet_small --rounds 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from revisions import PROJECT, tree_at

RESULTS_DIR = PROJECT / "experiments" / "results"
RESULTS = RESULTS_DIR / "bench_step.md"
MODELS = ("capsnet_small", "capsnet")
WARMUP = 3  # steps before timing: the first ones allocate buffers and tune oneDNN's kernels (compile: more)
COMPILE_WARMUP = 6
BASELINE = "863d22d"  # the code before the speed work
VOTES_REVISION = "f6ca120"  # the last code whose votes autocast ran in bf16


def worker(tree: Path, model: str, overrides: list[str], channels_last: bool, batch: int, steps: int) -> dict:
    """In this process: the step times of ``model`` as the tree at ``tree`` builds and trains it."""
    sys.path.insert(0, str(tree / "src"))
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from capsexp.config.hydra_setup import compose
    from capsexp.config.instantiation import build_model

    cfg = compose([f"model={model}", "data=mnist", f"data.batch_size={batch}", "trainer=cpu", *overrides])
    try:  # the trees that have trainer.precision=auto resolve it as their runs do
        from capsexp.config.precision import resolve, routing_of

        precision = resolve(cfg.trainer.precision, model, routing_of(cfg.model), "cpu").lightning
    except ImportError:
        precision = str(cfg.trainer.precision)
    torch.manual_seed(0)
    module = build_model("model", cfg.model)
    images = torch.rand(batch * (COMPILE_WARMUP + steps), 1, 28, 28)
    if channels_last:
        module = module.to(memory_format=torch.channels_last)
        images = images.contiguous(memory_format=torch.channels_last)
    warmup = COMPILE_WARMUP if cfg.model.get("compile") else WARMUP
    times: list[float] = []

    class Timer(L.Callback):
        def on_train_batch_start(self, *args) -> None:
            self.started = time.perf_counter()

        def on_train_batch_end(self, *args) -> None:
            times.append(time.perf_counter() - self.started)

    labels = torch.randint(0, 10, (len(images),))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        precision=precision,
        max_steps=warmup + steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Timer()],
    )
    trainer.fit(module, DataLoader(TensorDataset(images, labels), batch_size=batch))
    return {"precision": precision, "step_s": statistics.median(times[warmup:])}


def variants(args: argparse.Namespace) -> dict[str, tuple[Path, list[str], bool]]:
    """name: (tree, overrides, channels-last); the first is the default every ratio is over."""
    baseline = tree_at(args.baseline, "src", "conf")
    votes = tree_at(args.votes_revision, "src", "conf", option="--votes-revision")
    return {
        "default": (PROJECT, [], False),
        "REV": (baseline, [], False),
        "float32": (PROJECT, ["trainer.precision=32-true"], False),
        "bf16-mixed": (PROJECT, ["trainer.precision=bf16-mixed"], False),
        "foreach Adam": (PROJECT, ["model.optimizer.fused=false"], False),
        "channels-last": (PROJECT, [], True),
        "compiled": (PROJECT, ["model.compile=true"], False),
        "bf16, foreach Adam": (PROJECT, ["trainer.precision=bf16-mixed", "model.optimizer.fused=false"], False),
        "bf16 votes": (votes, ["trainer.precision=bf16-mixed"], False),
    }


def run_worker(tree: Path, model: str, overrides: list[str], channels_last: bool, args: argparse.Namespace) -> dict:
    """One worker process; its result."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONWARNINGS": "ignore"}
    command = [
        sys.executable,
        __file__,
        "--worker",
        str(tree),
        "--models",
        model,
        *(["--channels-last"] * channels_last),
    ]
    command += ["--batch", str(args.batch), "--steps", str(args.steps), "--overrides", *overrides]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the worker of {model} at {tree} ({' '.join(overrides)}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def quartiles(values: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default=BASELINE, help="the git revision REV of the page")
    parser.add_argument("--votes-revision", default=VOTES_REVISION)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per process (after the warm-up)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--overrides", nargs="*", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--channels-last", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        found = worker(args.worker, args.models[0], args.overrides, args.channels_last, args.batch, args.steps)
        print(json.dumps(found))
        return

    load = os.getloadavg()[0]
    chosen = variants(args)
    names = list(chosen)
    results: dict[str, dict[str, dict]] = {}
    for model in args.models:
        times: dict[str, list[dict]] = {name: [] for name in names}
        for round_ in range(args.rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                tree, overrides, channels_last = chosen[name]
                times[name].append(run_worker(tree, model, overrides, channels_last, args))
            ratios = {name: times[name][-1]["step_s"] / times["default"][-1]["step_s"] for name in names}
            print(f"{model} round {round_ + 1}: " + ", ".join(f"{n} {r:.2f}" for n, r in ratios.items()), flush=True)
        results[model] = {}
        for name in names:
            ratios = [t["step_s"] / d["step_s"] for t, d in zip(times[name], times["default"], strict=True)]
            results[model][name] = {
                "precision": times[name][0]["precision"],
                "step_ms": 1000 * statistics.median(t["step_s"] for t in times[name]),
                "ratio": statistics.median(ratios),
                "quartiles": quartiles(ratios),
                "ratios": ratios,
            }
    write(results, args, load)


# What each variant is, for the page.
DESCRIBED = {
    "default": "this tree's defaults (`trainer.precision=auto`, fused Adam)",
    "REV": "REV's defaults: the code before the speed work",
    "float32": "`trainer.precision=32-true`",
    "bf16-mixed": "`trainer.precision=bf16-mixed`",
    "foreach Adam": "`model.optimizer.fused=false` (torch's default Adam implementation)",
    "channels-last": "the net and each batch in channels-last memory format",
    "compiled": "`model.compile=true` (torch.compile of the net, Inductor on the CPU)",
    "bf16, foreach Adam": "`trainer.precision=bf16-mixed model.optimizer.fused=false`",
    "bf16 votes": "VOTES's code at `trainer.precision=bf16-mixed` (its Adam foreach): votes and routing in bf16",
}


def write(results: dict, args: argparse.Namespace, load: float) -> None:
    sys.path.insert(0, str(PROJECT / "src"))
    import torch

    from capsexp.records.machine import cpu_name

    options = [f"--models {' '.join(args.models)}", f"--rounds {args.rounds}", f"--steps {args.steps}"]
    options += [f"--batch {args.batch}", f"--threads {args.threads}", "--baseline REV", "--votes-revision VOTES"]
    command = "python experiments/bench_step.py " + " ".join(options)
    lines = [
        "# A training step at the default settings, and each speed choice on its own",
        "",
        f"- Machine: {cpu_name()}, {args.threads} torch thread{'s' if args.threads > 1 else ''}, CPU only, "
        f"torch {torch.__version__.split('+')[0]}, Python {platform.python_version()}; load average over the "
        f"minute before: {load:.2f} (0 on an idle machine).",
        f"- Date: {datetime.date.today().isoformat()}.",
        f"- Command: `{command}`; REV: the code before the speed work; VOTES: the last code whose votes ran in "
        "bf16 under autocast.",
        "",
        "A step: Lightning's `Trainer.fit` of `python -m capsexp model=<model> data=mnist`'s LightningModule, "
        f"batch {args.batch} of 1x28x28 images, at the precision `trainer.precision` gives (`auto` resolved as a "
        "run resolves it), with the config's optimizer; no validation, logging or checkpoints. Each variant in "
        f"processes of its own, {args.rounds} rounds in turning order, each process timing {args.steps} steps "
        f"after a warm-up of {WARMUP} ({COMPILE_WARMUP} compiled): their median. A ratio is a variant's step "
        "over the default's in the same round: its median over the rounds, and the quartiles.",
        "",
    ]
    for model, found in results.items():
        lines += [
            f"## model={model}",
            "",
            "| variant | precision | step | over the default (median) | quartiles |",
            "| --- | --- | ---: | ---: | --- |",
        ]
        for name, row in found.items():
            low, high = row["quartiles"]
            lines.append(
                f"| {DESCRIBED[name]} | {row['precision']} | {row['step_ms']:.1f} ms | {row['ratio']:.2f}x "
                f"| {low:.2f}x to {high:.2f}x |"
            )
        default_over_rev = 1 / found["REV"]["ratio"]
        votes = found["bf16 votes"]["ratio"] / found["bf16, foreach Adam"]["ratio"]
        lines += [
            "",
            f"The default's step is **{default_over_rev:.2f}x** REV's (the inverse of REV's median ratio). "
            f"bf16 votes against float32 votes, both at bf16-mixed with foreach Adam: {votes:.2f}x.",
            "",
        ]
    RESULTS.write_text("\n".join(lines))
    (RESULTS_DIR / "bench_step.json").write_text(json.dumps(results, indent=1) + "\n")
    print(RESULTS.relative_to(PROJECT))


if __name__ == "__main__":
    main()
