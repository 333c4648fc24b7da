"""The benchmark tables drawn: throughput against parameters for every model and routing, and accuracy against
throughput where a study page gives the accuracy; writes experiments/results/benchmark.md and benchmark.png
from experiments/results/benchmark-<device>-<precision>.csv (experiments/bench_table.py) and the precision
equivalence study's runs.

    python experiments/benchmark_page.py
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from capsexp.records.metric_names import TEST_ACC
from capsexp.results.plots import DPI, _pyplot
from capsexp.results.runs import KEPT_RUNS, find_runs
from capsexp.studies.precision import ARM, PRECISION

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the checkout (experiments/ run only there)

RESULTS = PROJECT_ROOT / "experiments" / "results"
PAGE, FIGURE = RESULTS / "benchmark.md", RESULTS / "benchmark.png"
ACCURACY_PAGE = RESULTS / "precision_equivalence_quick"
# The equivalence study's arms as the benchmark's rows: (model, routing); routing "" is the model's own.
ARM_ROWS = {
    "capsnet_small": ("capsnet_small", "dynamic"),
    "capsnet_uniform": ("capsnet", "uniform"),
    "em_caps_small": ("em_caps_small", ""),
    "lenet5": ("lenet5", ""),
}


def read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def accuracies() -> dict[tuple[str, str], tuple[float, int]]:
    """(model, routing): the mean float32 test accuracy (%) of the equivalence study's seeds, and their count."""
    runs = find_runs(ACCURACY_PAGE / KEPT_RUNS) if (ACCURACY_PAGE / KEPT_RUNS).is_dir() else []
    found = {}
    for arm, row in ARM_ROWS.items():
        values = [
            run.final(TEST_ACC)
            for run in runs
            if run.choice(ARM) == arm and run.choice(PRECISION) == "32-true" and run.final(TEST_ACC) is not None
        ]
        if values:
            found[row] = (100 * statistics.fmean(values), len(values))
    return found


def main() -> None:
    tables = {path.stem.rpartition("-")[2]: read(path) for path in sorted(RESULTS.glob("benchmark-cpu-*.csv"))}
    if not tables:
        raise SystemExit("no experiments/results/benchmark-cpu-*.csv: run experiments/bench_table.py first")
    float32, auto = tables.get("float32", []), tables.get("auto", [])
    key = lambda row: (row["model"], row["routing"])  # noqa: E731
    by_key_auto = {key(row): row for row in auto}
    shown = accuracies()
    plt = _pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2))
    labelled = set()
    for index, row in enumerate(float32):
        routed = row["routing"] != ""
        colour = f"C{index % 10}"
        parameters, speed = int(row["param_count"]), float(row["train_samples_per_sec"])
        left.scatter(parameters, speed, color=colour, marker="^" if routed else "o", s=36)
        if row["model"] not in labelled:  # a routed model's routings share its parameters: one label
            count = sum(r["model"] == row["model"] for r in float32)
            label = row["model"] + (f" ({count} routings, table below)" if routed else "")
            left.annotate(label, (parameters, speed), fontsize=7.5, xytext=(5, 4), textcoords="offset points")
            labelled.add(row["model"])
        other = by_key_auto.get(key(row))
        if other and other["precision"] != row["precision"]:
            faster = float(other["train_samples_per_sec"])
            left.scatter(
                parameters,
                faster,
                color=colour,
                marker="*",
                s=90,
                label=f"{row['model']} ({row['routing']}) under auto",
            )
    left.legend(fontsize="small", loc="lower left")
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("parameters")
    left.set_ylabel("training samples/s (batch 32, one thread)")
    left.set_title(
        "Training throughput in float32 (star: under trainer.precision=auto where it chose bf16)", fontsize="medium"
    )
    left.grid(alpha=0.3, which="both")
    for row_key, (accuracy, _) in shown.items():
        row = next(r for r in float32 if key(r) == row_key)
        speed = float(row["train_samples_per_sec"])
        right.scatter(speed, accuracy, s=40)
        label = row_key[0] + (f" ({row_key[1]})" if row_key[1] else "")
        right.annotate(label, (speed, accuracy), fontsize=8, xytext=(4, 2), textcoords="offset points")
    right.set_xscale("log")
    right.set_xlabel("training samples/s (float32)")
    right.set_ylabel(
        f"MNIST test accuracy (%), float32, mean of {max((s for _, s in shown.values()), default=0)} seeds"
    )
    right.set_title("Accuracy at the equivalence study's budgets (not one budget: see the page)", fontsize="medium")
    right.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(FIGURE, dpi=DPI, bbox_inches="tight")
    plt.close(figure)
    machine = float32[0] if float32 else auto[0]
    lines = [
        "# Capsule models' throughput, in timm's benchmark format",
        "",
        f"- Machine: {machine['device']}, {machine['threads']} thread(s), CPU only, torch {machine['torch_version']}.",
        "- Commands: `OMP_NUM_THREADS=1 python experiments/bench_table.py` (writes `benchmark-cpu-float32.csv` and "
        "`benchmark-cpu-auto.csv`), then `python experiments/benchmark_page.py`.",
        "",
        "![benchmark](benchmark.png)",
        "",
        "Left: every model config, and CapsNet's two sizes with each routing of `model/routing` (triangles), at "
        "batch 32 of 28x28 MNIST-shaped images: a training step as a run makes it (forward, the model's objective, "
        "backward, the config's optimizer). Right: accuracy where a study page gives it for the same model, from "
        "[precision_equivalence_quick](precision_equivalence_quick/README.md)'s float32 runs: capsnet_small and "
        "LeNet5 after one epoch, CapsNet (uniform coupling) and em_caps_small after 300 steps of 32. The budgets "
        "differ, so the right panel is no ranking of the models; em_caps, vb_caps and the baseline CNN have no "
        "MNIST page at a comparable budget and are drawn on the left only.",
        "",
        "| model | routing | params | GMACs | train samples/s, float32 | train samples/s, auto | auto's precision "
        "| infer samples/s, float32 | step, float32 | peak memory, float32 |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for row in float32:
        other = by_key_auto.get(key(row), {})
        lines.append(
            f"| {row['model']} | {row['routing'] or '(its own)'} | {int(row['param_count']):,} | {row['gmacs']} "
            f"| {row['train_samples_per_sec']} | {other.get('train_samples_per_sec', 'n/a')} | "
            f"{other.get('precision', 'n/a')} | {row['infer_samples_per_sec']} | {row['train_step_time_ms']} ms "
            f"| {row['peak_memory_mib']} MiB |"
        )
    same = [
        float(row["train_samples_per_sec"]) / float(by_key_auto[key(row)]["train_samples_per_sec"])
        for row in float32
        if key(row) in by_key_auto and by_key_auto[key(row)]["precision"] == row["precision"]
    ]
    if same:
        spread = max(max(same), 1 / min(same))
        lines += [
            "",
            f"Each row is one process's measurement. The {len(same)} rows that ran in the same precision in both "
            f"files (measured twice) differ by up to {100 * (spread - 1):.0f}% in training samples/s: a difference "
            "between the two files' columns smaller than that is not one this page can show.",
        ]
    lines += [
        "",
        "What this shows: each model's cost on this CPU at one batch size, one thread. It does not show a GPU's "
        "(`make bench-gpu` writes `benchmark-gpu-*.csv` where a GPU exists; none has been measured), nor the "
        "accuracy of the models at a common budget.",
        "",
    ]
    PAGE.write_text("\n".join(lines))
    print(PAGE.relative_to(PROJECT_ROOT))


if __name__ == "__main__":
    main()
