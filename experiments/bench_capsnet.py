"""CapsNet speed (and optionally accuracy) benchmark; writes experiments/results/bench.md.

Speed, in one process so that the shared machine's noise hits both alike: the training step of the
full CapsNet (forward, margin + reconstruction loss, backward, Adam) against the floor of the
architecture, the same step for conv1 + the PrimaryCaps convolution alone. Floor and full steps are
interleaved and their medians compared. Also: inference images/s and the peak RSS.

    python experiments/bench_capsnet.py                  # speed only, a few minutes on 2 cores
    python experiments/bench_capsnet.py --accuracy       # + one epoch of shifted MNIST via the CLI
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import statistics
from pathlib import Path

# As a user's script would: torch first, then capsexp as a library. Nothing set in the environment
# here: importing capsexp turns on huge pages for large CPU buffers (capsexp/__init__.py).
import torch
from torch import nn

from benchlib import cli_test_accuracy
from capsexp.lit import CapsuleLoss
from capsexp.models import CapsNet
from capsexp.records.machine import cpu_name
from timing import Stopwatch

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the checkout (experiments/ run only there)

RESULTS = PROJECT_ROOT / "experiments" / "results" / "bench.md"
ACCURACY_COMMAND = ["model=capsnet", "data=shifted_mnist", "trainer.max_epochs=1", "trainer.accelerator=cpu"]


def timed(step) -> float:
    with Stopwatch() as watch:
        step()
    return watch.seconds


def speed(batch_size: int, repeats: int, warmup: int) -> dict[str, float]:
    torch.manual_seed(0)
    images = torch.rand(batch_size, 1, 28, 28)
    targets = torch.randint(0, 10, (batch_size,))

    model = CapsNet()
    objective = CapsuleLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    # The floor: the two convolutions, which hold 65% of the parameters and nearly all the FLOPs.
    floor_convs = nn.Sequential(nn.Conv2d(1, 256, 9), nn.ReLU(inplace=True), nn.Conv2d(256, 256, 9, stride=2))
    floor_optimizer = torch.optim.Adam(floor_convs.parameters(), lr=1e-3)

    def full_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        objective(model(images, targets), images, targets)["loss"].backward()
        optimizer.step()

    def floor_step() -> None:
        floor_optimizer.zero_grad(set_to_none=True)
        floor_convs(images).sum().backward()
        floor_optimizer.step()

    @torch.no_grad()
    def inference() -> None:
        model(images)

    for _ in range(warmup):
        full_step(), floor_step()
    full, floor, ratios = [], [], []
    for _ in range(repeats):
        floor.append(timed(floor_step))
        full.append(timed(full_step))
        ratios.append(full[-1] / floor[-1])
    model.eval()
    inference()
    infer = [timed(inference) for _ in range(repeats)]
    return {
        "batch_size": batch_size,
        "repeats": repeats,
        "full_step_ms": 1000 * statistics.median(full),
        "floor_step_ms": 1000 * statistics.median(floor),
        "ratio_of_medians": statistics.median(full) / statistics.median(floor),
        "median_ratio": statistics.median(ratios),
        # The shared machine's noise comes in bursts: the quartiles say how far one figure can be trusted.
        "ratio_quartiles": statistics.quantiles(ratios, n=4)[::2],
        "train_images_per_s": batch_size / statistics.median(full),
        "floor_images_per_s": batch_size / statistics.median(floor),
        "inference_images_per_s": batch_size / statistics.median(infer),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def accuracy(data_dir: str | None) -> dict[str, float]:
    """One epoch of the README command through the CLI; test accuracy from its TensorBoard events."""
    return cli_test_accuracy(ACCURACY_COMMAND, "bench", data_dir)


def write(results: dict, acc: dict | None, path: Path) -> str:
    lines = [
        "# CapsNet benchmark",
        "",
        f"Written by `experiments/bench_capsnet.py` on {datetime.date.today()}: {cpu_name()}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, Python {platform.python_version()}, "
        f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE')}.",
        "",
        "## Speed (MNIST CapsNet, 28x28, 3 routing iterations, with decoder)",
        "",
        f"Batch {results['batch_size']}; median of {results['repeats']} interleaved steps per measurement.",
        "The floor is the training step of conv1 + the PrimaryCaps convolution alone (forward, backward,",
        "Adam); the full step adds squash, DigitCaps votes, routing, decoder and both losses.",
        "",
        "| measurement | value |",
        "| --- | ---: |",
        f"| full training step | {results['full_step_ms']:.0f} ms |",
        f"| floor training step (conv1 + primary conv) | {results['floor_step_ms']:.0f} ms |",
        f"| full / floor (ratio of medians) | {results['ratio_of_medians']:.3f} |",
        f"| full / floor (median of paired ratios) | {results['median_ratio']:.3f} |",
        "| full / floor (quartiles of paired ratios) | "
        f"{results['ratio_quartiles'][0]:.3f} to {results['ratio_quartiles'][1]:.3f} |",
        f"| training throughput | {results['train_images_per_s']:.1f} images/s |",
        f"| floor throughput | {results['floor_images_per_s']:.1f} images/s |",
        f"| inference throughput | {results['inference_images_per_s']:.1f} images/s |",
        f"| peak RSS of the benchmark process | {results['peak_rss_mib']:.0f} MiB |",
        "",
    ]
    if acc:
        lines += [
            "## Accuracy",
            "",
            f"`python -m capsexp {' '.join(ACCURACY_COMMAND)}` on real MNIST:",
            "",
            "| test accuracy | wall time |",
            "| ---: | ---: |",
            f"| {100 * acc['test_acc']:.2f}% | {acc['wall_s'] / 60:.1f} min |",
            "",
        ]
    text = "\n".join(lines)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--accuracy", action="store_true", help="also train one epoch through the CLI")
    parser.add_argument("--data-dir", default=None, help="data dir for --accuracy (default: paths.data_dir)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.repeats < 2:
        parser.error(f"--repeats must be at least 2 (the page gives quartiles), got {args.repeats}")
    results = speed(args.batch_size, args.repeats, args.warmup)
    acc = accuracy(args.data_dir) if args.accuracy else None
    print(write(results, acc, args.output))


if __name__ == "__main__":
    main()
