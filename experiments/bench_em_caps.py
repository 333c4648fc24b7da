"""EM-capsule (MatrixCapsNet) speed and memory benchmark; writes experiments/results/bench_em.md.

The smallNORB network (A=B=C=D=32, K=3, 4x4 poses) under the routing options of model=em_caps and of
model=em_caps_paper, on 2x32x32 inputs with
5 classes. Each batch size runs in its own process, so that its peak RSS is its own. Routing's share
is the CPU time of the profiled ``em_routing`` calls (forward and the autograd nodes they created)
over the whole step, from one extra profiled step; the peak RSS is read before it.

    python experiments/bench_em_caps.py                     # batch 8 and 32, model=em_caps and em_caps_paper
    python experiments/bench_em_caps.py --batch-sizes 8     # one size
    python experiments/bench_em_caps.py --accuracy          # + a fixed number of MNIST steps via the CLI
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as importing capsexp does (capsexp/__init__.py)

import torch

from benchlib import cli_test_accuracy, cpu_name
from capsexp import CONFIG_DIR, PROJECT_ROOT
from capsexp.timing import Stopwatch

RESULTS = PROJECT_ROOT / "experiments" / "results" / "bench_em.md"
# A whole epoch of MNIST takes hours on 2 CPU cores: a fixed number of steps, then the full test set.
ACCURACY_STEPS = 300
ACCURACY_COMMAND = [
    "model=em_caps",
    "data=mnist",
    "data.batch_size=16",
    "trainer.max_epochs=1",
    f"trainer.limit_train_batches={ACCURACY_STEPS}",
    "trainer.val_check_interval=1.0",
    "trainer.limit_val_batches=20",
    "trainer.accelerator=cpu",
]


RECIPES = {"default": "em_caps", "paper": "em_caps_paper"}  # recipe: its model config


def net_options(recipe: str) -> dict:
    """The MatrixCapsNet arguments of a model config (A=B=C=D=32), composed as the CLI composes it,
    less the data geometry."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        net = compose(config_name="config", overrides=[f"model={RECIPES[recipe]}"]).model.net
    return {
        key: value
        for key, value in OmegaConf.to_container(net).items()
        if key not in ("_target_", "in_channels", "image_size", "num_classes")
    }


def measure(batch_size: int, repeats: int, recipe: str = "default") -> dict[str, float]:
    """Run in a fresh process: step timings, routing share, peak RSS."""
    from torch.profiler import ProfilerActivity, profile

    import capsexp.nn.em_caps as em_caps_layers
    from capsexp.models import MatrixCapsNet
    from capsexp.nn.functional import em_routing, spread_loss

    torch.manual_seed(0)
    net = MatrixCapsNet(in_channels=2, num_classes=5, image_size=32, **net_options(recipe))
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    images, targets = torch.rand(batch_size, 2, 32, 32), torch.randint(0, 5, (batch_size,))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        spread_loss(net(images).scores, targets, 0.2).backward()
        optimizer.step()

    @torch.no_grad()
    def infer() -> None:
        net(images)

    step()  # warm-up
    steps = []
    for _ in range(repeats):
        with Stopwatch() as watch:
            step()
        steps.append(watch.seconds)
    infer()
    inference = []
    for _ in range(repeats):
        with Stopwatch() as watch:
            infer()
        inference.append(watch.seconds)

    peak_rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # before the profiler's own memory

    # Routing's share: tag em_routing's forward; its backward nodes are the autograd functions
    # created inside that scope, which the profiler links by sequence number.
    original = em_routing

    def tagged(*args, **kwargs):
        with torch.profiler.record_function("em_routing"):
            return original(*args, **kwargs)

    em_caps_layers.em_routing = tagged  # the name the layers call
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    em_caps_layers.em_routing = original
    events = prof.events()
    total = sum(e.self_cpu_time_total for e in events)
    forward_ids = {e.sequence_nr for e in events if e.sequence_nr >= 0 and _under(e, "em_routing")}
    routing = sum(
        e.self_cpu_time_total
        for e in events
        if _under(e, "em_routing") or (e.sequence_nr in forward_ids and _is_backward(e))
    )
    return {
        "batch_size": batch_size,
        "train_images_per_s": batch_size / statistics.median(steps),
        "train_step_s": statistics.median(steps),
        "inference_images_per_s": batch_size / statistics.median(inference),
        "routing_share": routing / total if total else float("nan"),
        "peak_rss_gib": peak_rss_gib,
    }


def _under(event, name: str) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name == name:
            return True
        parent = parent.cpu_parent
    return False


def _is_backward(event) -> bool:
    parent = event
    while parent is not None:
        if "Backward" in parent.name or parent.name.startswith("autograd::engine"):
            return True
        parent = parent.cpu_parent
    return False


def accuracy(data_dir: str | None) -> dict[str, float]:
    """Train ACCURACY_STEPS steps through the CLI; test accuracy (full test set) from the event files."""
    return cli_test_accuracy(ACCURACY_COMMAND, "bench_em", data_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--accuracy", action="store_true", help=f"also train {ACCURACY_STEPS} MNIST steps via the CLI")
    parser.add_argument("--data-dir", default=None, help="data dir for --accuracy (default: paths.data_dir)")
    parser.add_argument(
        "--recipes",
        nargs="+",
        choices=list(RECIPES),
        default=list(RECIPES),
        help="model=em_caps (default) and/or model=em_caps_paper",
    )
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker-recipe", default="default", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args.worker, args.repeats, args.worker_recipe)))
        return

    rows = []
    for recipe in args.recipes:
        for batch_size in args.batch_sizes:
            done = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    str(batch_size),
                    "--repeats",
                    str(args.repeats),
                    "--worker-recipe",
                    recipe,
                ],
                capture_output=True,
                text=True,
            )
            name = f"model={RECIPES[recipe]}"
            if done.returncode != 0:  # no page with holes: say what failed, and stop
                sys.exit(f"{name}, batch {batch_size}: the measurement failed:\n{done.stderr[-3000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(
                f"| {name} | {batch_size} | {result['train_images_per_s']:.2f} | {result['train_step_s']:.2f} s | "
                f"{result['inference_images_per_s']:.2f} | {100 * result['routing_share']:.0f}% | "
                f"{result['peak_rss_gib']:.2f} GiB |"
            )
    cpu = cpu_name()
    text = "\n".join(
        [
            "# EM capsules (MatrixCapsNet) benchmark",
            "",
            f"Written by `experiments/bench_em_caps.py` on {datetime.date.today()}: {cpu}, "
            f"{torch.get_num_threads()} threads, torch {torch.__version__}.",
            "A=B=C=D=32, K=3, 4x4 poses, 2x32x32 inputs, 5 classes, Adam; each model config's own routing options "
            "(em_caps: 2 EM iterations, BatchNorm after conv1; em_caps_paper: 3 iterations);",
            f"medians of {args.repeats} steps; each row in its own process. On a shared machine step times vary",
            "between runs (by up to 40% seen here): compare the rows of one page, not figures across pages.",
            "",
            "| recipe | batch | training images/s | training step | inference images/s "
            "| routing share of the step | peak RSS |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
            *rows,
            "",
        ]
    )
    if args.accuracy:
        acc = accuracy(args.data_dir)
        text += "\n" + "\n".join(
            [
                "## Accuracy (MNIST, fixed number of steps)",
                "",
                f"`python -m capsexp {' '.join(ACCURACY_COMMAND)}`: {ACCURACY_STEPS} steps of batch 16 under the",
                "default recipe of model=em_caps, then the full 10,000-image test set (before the recipe of issue 10,",
                "the same command reached 47.14% in 13.4 min).",
                "",
                "| test accuracy | wall time |",
                "| ---: | ---: |",
                f"| {100 * acc['test_acc']:.2f}% | {acc['wall_s'] / 60:.1f} min |",
                "",
            ]
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
