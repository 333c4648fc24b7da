"""What each routing algorithm costs in CapsNet's place; writes experiments/results/bench_routing.md.

The nets of ``experiment=routing_comparison study=quick``: ``model=capsnet_small`` on 40x40 translated
MNIST with each ``model/routing=<name>``, the shared transform without routing (affcaps) and the fully
connected head of matched size. Per net: its
parameters and forward FLOPs per image, the time of a training step (forward, margin and reconstruction
loss, backward, Adam) at batch 32, and the peak memory a training step adds.

Speed, in one process so that the shared machine's noise hits every net alike: one step of each net in
turn, round after round; each net's median, and the median over rounds of its step time over the
uniform-coupling net's in the same round. Memory: each net in a fresh process, the peak resident set
during two training steps minus the resident set before the first.

    python experiments/bench_routing.py                  # about 3 minutes on 2 cores
    OMP_NUM_THREADS=1 python experiments/bench_routing.py  # one thread, as the study's runs had
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
from pathlib import Path

import torch

from capsexp.config.hydra_setup import ROUTINGS, compose
from capsexp.config.instantiation import build_model
from capsexp.records.machine import cpu_name
from capsexp.run.model_cost import forward_flops_per_image, parameter_count
from timing import Stopwatch

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the checkout (experiments/ run only there)

RESULTS = PROJECT_ROOT / "experiments" / "results" / "bench_routing.md"
BASE = ["model=capsnet_small", "data=translated_mnist"]
PLAIN_HEAD = "fully_connected head"  # the non-capsule reference: model.net.head=fully_connected
SHARED = "affcaps"  # Gu & Tresp's capsules without routing: one W per child type, uniform averaging
REFERENCE = "uniform"  # the ratios' denominator: routing removed, the same layers


# EM capsules with each of their routings: VB against EM in model=em_caps, as its own table.
EM_NETS = {"em": ["model=em_caps", "data=mnist"], "vb": ["model=em_caps", "data=mnist", "model/routing=vb"]}
EM_REFERENCE = "em"


def nets() -> dict[str, list[str]]:
    """The overrides of each net, by name: every routing option, the shared transform without routing, then
    the plain head."""
    found = {name: [*BASE, f"model/routing={name}"] for name in ROUTINGS}
    found[SHARED] = [*BASE, "model/routing=uniform", "model.net.shared_transform=true"]
    found[PLAIN_HEAD] = [*BASE, "model.net.head=fully_connected"]
    return found


def build(overrides: list[str]):
    """The LightningModule a run with these overrides trains (its forward feeds the net the labels where the
    net takes them), and the input geometry."""
    cfg = compose(overrides)
    module = build_model("model", cfg.model)
    return module, (cfg.geometry.channels, cfg.geometry.image_size), cfg.data.batch_size


class Step:
    """One training step of a net on fixed random images (the cost does not depend on their content)."""

    def __init__(self, overrides: list[str]) -> None:
        torch.manual_seed(0)
        self.module, (channels, size), batch = build(overrides)
        self.net, self.objective = self.module.net, self.module.objective
        self.geometry = (channels, size)
        self.images = torch.rand(batch, channels, size, size)
        self.targets = torch.randint(0, 10, (batch,))
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=1e-3)

    def __call__(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        output = self.module(self.images, self.targets)
        self.objective(output, self.images, self.targets)["loss"].backward()
        self.optimizer.step()


def status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (Linux): ``VmRSS`` the resident set now, ``VmHWM`` its peak."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field + ":"))
    return int(line.split()[1])


def memory_of(name: str) -> float:
    """MiB that two training steps of net ``name`` add to the peak resident set of a fresh process: the
    peak is reset once the net is built (``5`` into /proc/self/clear_refs), so that importing and building
    do not set it."""
    step = Step({**nets(), **{f"em_caps {n}": o for n, o in EM_NETS.items()}}[name])
    Path("/proc/self/clear_refs").write_text("5")
    before = status_kib("VmRSS")
    step(), step()
    return (status_kib("VmHWM") - before) / 1024


def speed(rounds: int, warmup: int, compared=None, reference: str = REFERENCE) -> dict[str, dict[str, float]]:
    steps = {name: Step(overrides) for name, overrides in (compared or nets()).items()}
    for _ in range(warmup):
        for step in steps.values():
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            with Stopwatch() as watch:
                step()
            times[name].append(watch.seconds)
    results = {}
    for name, step in steps.items():
        ratios = [t / u for t, u in zip(times[name], times[reference], strict=True)]
        results[name] = {
            "parameters": parameter_count(step.net),
            "mflops": forward_flops_per_image(step.net, *step.geometry) / 1e6,
            "step_ms": 1000 * statistics.median(times[name]),
            "ratio": statistics.median(ratios),
        }
    return results


def write(results: dict, em_results: dict, rounds: int, em_rounds: int, command: str, load: float) -> None:
    threads = torch.get_num_threads()
    lines = [
        "# What each routing algorithm costs in CapsNet's place",
        "",
        f"- Machine: {cpu_name()}, {threads} torch thread{'s' if threads > 1 else ''}, CPU only, "
        f"torch {torch.__version__.split('+')[0]}, Python {platform.python_version()}; load average over the "
        f"minute before: {load:.2f} (0 on an idle machine).",
        f"- Date: {datetime.date.today().isoformat()}.",
        f"- Command: `{command}`",
        "",
        "The nets of `experiment=routing_comparison study=quick`: `model=capsnet_small` on 1x40x40 input with "
        f"each `model/routing=<name>`, `{SHARED}` (`model/routing=uniform model.net.shared_transform=true`) and "
        "`model.net.head=fully_connected`. A training step at batch 32: "
        "forward, margin and reconstruction loss, backward, Adam. Step times: the median of "
        f"{rounds} steps of each net, taken in turn in one process; the ratio: the median over those rounds "
        f"of each net's step time over `{REFERENCE}`'s in the same round. Peak memory: what two training steps "
        "add to the resident set of a fresh process (its peak during them, `VmHWM` reset after the net was "
        "built, minus the resident set before the first). FLOPs: matrix products and convolutions of one "
        "image's forward pass, 2 per multiply-add (element-wise work is not counted).",
        "",
        f"| net | parameters | MFLOPs per image | training step (ms) | step time / {REFERENCE}'s "
        "| peak memory of a step (MiB) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['parameters']:,} | {r['mflops']:,.1f} | {r['step_ms']:.0f} | {r['ratio']:.2f} "
            f"| {r['memory_mib']:.0f} |"
        )
    lines += [
        "",
        "## EM capsules: VB routing in EM's place",
        "",
        f"`model=em_caps data=mnist` with its EM routing and with `model/routing=vb`: the median of {em_rounds} "
        "training steps of each at batch 32, in turn in one process; the ratio over EM's in the same round; peak "
        "memory as above.",
        "",
        f"| net | parameters | training step (ms) | step time / {EM_REFERENCE}'s | peak memory of a step (MiB) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, r in em_results.items():
        lines.append(
            f"| {name} | {r['parameters']:,} | {r['step_ms']:.0f} | {r['ratio']:.2f} | {r['memory_mib']:.0f} |"
        )
    lines += [
        "",
        "What this shows: the cost of each routing in these backbones on this CPU, at one batch size. It does not "
        "show a GPU's ratios, where the convolutions are cheaper relative to routing's small operations.",
    ]
    RESULTS.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--em-rounds", type=int, default=5, help="rounds of the EM capsule nets (seconds a step)")
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)  # the child process of one net's measurement
    args = parser.parse_args()
    if args.memory_of:
        print(json.dumps(memory_of(args.memory_of)))
        return
    load = os.getloadavg()[0]
    results = speed(args.rounds, args.warmup)
    em_results = speed(args.em_rounds, 1, EM_NETS, EM_REFERENCE)
    for prefix, found in (("", results), ("em_caps ", em_results)):
        for name in found:  # each in its own process: a peak resident set only grows
            child = [sys.executable, __file__, "--memory-of", prefix + name]
            found[name]["memory_mib"] = json.loads(
                subprocess.run(child, capture_output=True, text=True, check=True).stdout
            )
    command = "python experiments/bench_routing.py" + "".join(f" {a}" for a in sys.argv[1:])
    write(results, em_results, args.rounds, args.em_rounds, command, load)
    print(RESULTS.read_text())


if __name__ == "__main__":
    main()
