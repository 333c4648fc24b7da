"""experiments/: the benchmarks run on tiny synthetic data, and the results pages are portable."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from tests.helpers import PROJECT_ROOT


def test_results_pages_are_portable_and_say_things_once():
    """Paths relative to the repository (no machine's absolute path), and each header block once."""
    results = PROJECT_ROOT / "experiments" / "results"
    absolute_path = rb"(?<![\w.~])/(work|home|root|tmp|Users|mnt|scratch)/"
    pages = sorted(results.rglob("*.md"))
    assert pages
    for page in pages:
        text = page.read_text()
        assert not re.search(absolute_path.decode(), text), page
        assert text.count("- Machine:") <= 1 and text.count("- Commands:") <= 1, page
    # Committed run folders too: their configs and event files (the hyperparameters in them).
    for path in sorted(p for p in results.rglob("*") if p.is_file() and p.suffix != ".md"):
        assert not re.search(absolute_path, path.read_bytes()), path


@pytest.mark.slow  # seven study runs in child processes (about 65 s): make test-all
def test_bench_gpu_runs_its_code_path_on_the_cpu(tmp_path):
    """--smoke: the benchmark's runs, tiny and on the CPU, with smallNORB written synthetically in the
    official format; the page has a row per precision and the epoch timer's figures."""
    output = tmp_path / "bench_gpu.md"
    result = subprocess.run(
        [
            sys.executable,
            str(PROJECT_ROOT / "experiments" / "bench_gpu.py"),
            "--smoke",
            "--output",
            str(output),
            "--log-dir",
            str(tmp_path),
            "--only",
            "em_caps, 2x32x32, batch 32",
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "CAPSEXP_DATA_DIR": str(tmp_path / "no_data")},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = [line for line in output.read_text().splitlines() if line.startswith("| em_caps")]
    assert [row.split(" | ")[1] for row in rows] == ["fp32 (TF32)", "bf16-mixed"]
    assert all("failed" not in row and float(row.split(" | ")[4].replace(",", "")) > 0 for row in rows)


@pytest.mark.slow  # a benchmark worker timing every recipe (about 16 s): make test-all
def test_bench_em_caps_measures_each_recipe_as_its_model_config_sets_it():
    """One worker of experiments/bench_em_caps.py (batch 2, one step): the net built from the
    composed model config, its step timed, its routing share profiled."""
    worker = [sys.executable, str(PROJECT_ROOT / "experiments" / "bench_em_caps.py"), "--worker", "2"]
    result = subprocess.run(
        [*worker, "--repeats", "1", "--worker-recipe", "paper"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["train_step_s"] > 0 and 0 < figures["routing_share"] < 1

    from bench_em_caps import float32_errors, float64_on_rounded_inputs, net_options, recipe_text

    assert net_options("default")["routing"].iterations == 2 and net_options("paper")["routing"].iterations == 3
    # The page's header says what each recipe routes with, as its config sets it.
    assert recipe_text("paper") == "em_caps_paper: 3 EM iterations, E-step temperature 1, no BatchNorm after conv1"
    errors = float32_errors("paper", 0.01)  # the page's float32 table
    assert set(errors) == {"poses", "activations", "responsibilities", "vote_gradient"}
    assert 0 < max(errors.values()) < 1e-3
    # The floor row: float64 on the rounded inputs. On these votes their rounding is all the error.
    floor = float32_errors("paper", 0.01, em_routing=float64_on_rounded_inputs)
    assert floor["vote_gradient"] > 0 and errors["vote_gradient"] < 1.5 * floor["vote_gradient"]


@pytest.mark.slow  # two benchmark workers, one of them building a git revision's package (about 19 s): make test-all
def test_bench_em_caps_compares_with_the_net_of_a_git_revision():
    """--baseline REV: steps of the net as the working tree builds it and as REV's package does,
    interleaved."""
    worker = [sys.executable, str(PROJECT_ROOT / "experiments" / "bench_em_caps.py"), "--worker", "2"]
    result = subprocess.run(
        [*worker, "--repeats", "2", "--worker-task", "compare", "--baseline", "HEAD"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["current_step_s"] > 0 and figures["baseline_step_s"] > 0 and figures["median_ratio"] > 0
    result = subprocess.run(
        [*worker, "--worker-task", "compare", "--baseline", "no-such-rev"], capture_output=True, text=True
    )
    assert result.returncode != 0 and "git cannot show" in result.stderr


# A benchmark script's own run (make bench runs it whole): make test-all.
@pytest.mark.slow
def test_bench_routing_measures_every_routing_and_the_plain_head_as_the_study_builds_them():
    from bench_routing import PLAIN_HEAD, SHARED, Step, nets
    from capsexp.config.hydra_setup import ROUTINGS

    assert list(nets()) == [*ROUTINGS, SHARED, PLAIN_HEAD]
    shared = Step(nets()[SHARED]).net.digits
    assert shared.child_types == 8 and type(shared.routing).__name__ == "UniformRouting"  # one W per type
    step = Step(nets()["attention"])
    assert step.images.shape == (32, 1, 40, 40)  # the study's data and batch
    assert type(step.net.digits.routing).__name__ == "AttentionRouting" and step.net.conv1.out_channels == 64
    before = step.net.digits.weight.detach().clone()
    step()
    assert not torch.equal(before, step.net.digits.weight)  # a training step: the weights moved
    # A net's peak memory, in a process of its own: the votes alone are 32 x 1,152 x 10 x 16 floats (23.6 MB).
    child = [sys.executable, str(PROJECT_ROOT / "experiments" / "bench_routing.py"), "--memory-of", "uniform"]
    result = subprocess.run(child, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert 23.6 < json.loads(result.stdout) < 2000


def test_the_em_float32_page_rebuilds_from_its_record():
    """experiments/results/em_float32.md is what em_float32.py writes from em_float32.json."""
    import em_float32

    results = PROJECT_ROOT / "experiments" / "results"
    record = json.loads((results / "em_float32.json").read_text())
    assert em_float32.page(record) == (results / "em_float32.md").read_text()


def test_the_first_hour_page_rebuilds_from_its_record():
    """experiments/results/first_hour.md is what first_hour.py writes from first_hour.json, byte for byte."""
    import first_hour

    results = PROJECT_ROOT / "experiments" / "results"
    record = json.loads((results / "first_hour.json").read_text())
    assert first_hour.page(record) == (results / "first_hour.md").read_text()


# A benchmark script's own run (make bench runs it whole): make test-all.
@pytest.mark.slow
def test_a_benchmark_row_has_timms_columns_and_the_precision_auto_chose():
    """One row of experiments/bench_table.py (LeNet5 under trainer.precision=auto, one timed step): the
    CSV's columns, its own parameter count and a precision Lightning accepts."""
    sys.path.insert(0, str(PROJECT_ROOT / "experiments"))
    from bench_table import COLUMNS
    from capsexp.config.precision import BF16_MODELS, bf16_native

    worker = [sys.executable, str(PROJECT_ROOT / "experiments" / "bench_table.py"), "--worker", "lenet5", "", "auto"]
    done = subprocess.run([*worker, "--steps", "1", "--batch", "4"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert tuple(row) == COLUMNS
    assert row["param_count"] == 61_706  # LeNet5 on 28x28: 156 + 2,416 + 48,120 + 10,164 + 850
    assert row["precision"] == ("bf16-mixed" if "lenet5" in BF16_MODELS and bf16_native() else "32-true")
    assert row["train_samples_per_sec"] > 0 and row["batch_size"] == 4 and row["img_size"] == 28


def test_the_run_overhead_page_rebuilds_from_its_runs(tmp_path):
    """experiments/results/run_overhead/README.md is what run_overhead.py writes from the runs beside it."""
    written = tmp_path / "README.md"
    script = PROJECT_ROOT / "experiments" / "run_overhead.py"
    runs = "experiments/results/run_overhead/runs"
    done = subprocess.run(
        [sys.executable, str(script), runs, "--output", str(written)], cwd=PROJECT_ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert written.read_text() == (PROJECT_ROOT / runs).parent.joinpath("README.md").read_text()


def test_a_runs_phases_are_read_from_its_log_and_its_epoch_timer(tmp_path):
    """Set-up to the training line, validation the fit less its steps, test to the model card; a run whose
    timer counted its validations (the fit equal to its steps) or that was resumed (two fits) has none."""
    from torch.utils.tensorboard import SummaryWriter

    sys.path.insert(0, str(PROJECT_ROOT / "experiments"))
    from run_overhead import phases

    def run(name: str, lines: list[tuple[str, str]], epochs: list[float]) -> dict | None:
        folder = tmp_path / name
        folder.mkdir()
        log = [f"[2026-12-07 10:{stamp},000][capsexp.x][INFO] - {text}" for stamp, text in lines]
        (folder / "capsexp.log").write_text("\n".join(log) + "\n")
        with SummaryWriter(str(folder)) as writer:
            for step, seconds in enumerate(epochs):
                writer.add_scalar("perf/train_epoch_s", seconds, step)
        return phases(folder)

    ran = [("00:00", "Run folder: x"), ("00:03", "Training"), ("00:05", "training: 10 steps"),
           ("01:00", "validation at step 5: val/acc 0.9"), ("02:05", "training done: 10 steps"),
           ("02:06", "Testing x.ckpt"), ("02:36", "Model card: x/model_card.md")]  # fmt: skip
    assert run("two_epochs", ran, [50.0, 40.0]) == {
        "set-up": 5.0, "training steps": 90.0, "validation": 30.0, "test": 30.0
    }  # fmt: skip
    assert run("timer_counted_validation", ran, [120.0]) is None
    assert run("resumed", [*ran[:3], *ran[1:]], [50.0, 40.0]) is None
