"""The routing comparison's page section: each configuration's cost and its accuracy at the training
time of the fastest, from its runs' event files and recorded hyperparameters."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from torch.utils.tensorboard import SummaryWriter

from capsexp.results.runs import find_runs, label_configurations
from capsexp.results.study import StudyPage
from capsexp.studies.routing import accuracy_at_step, cost_and_matched_time

CURVE_STEPS = (150, 300, 450, 600)
RUNS = {  # folder: (arm, seed, training seconds for 600 steps, val/acc at CURVE_STEPS, parameters)
    "0": ("fast", 1, 60.0, (0.5, 0.7, 0.8, 0.9), 1000),
    "1": ("fast", 2, 60.0, (0.5, 0.7, 0.8, 0.92), 1000),
    "2": ("slow", 1, 120.0, (0.6, 0.8, 0.9, 0.95), 2000),
    "3": ("slow", 2, 144.0, (0.6, 0.8, 0.9, 0.95), 2000),
}


def make_runs(folder: Path) -> None:
    for name, (arm, seed, seconds, curve, parameters) in RUNS.items():
        run = folder / name
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"+arm/routing={arm}", f"seed={seed}"]))
        with SummaryWriter(str(run / "tensorboard")) as writer:
            for step, value in zip(CURVE_STEPS, curve, strict=True):
                writer.add_scalar("val/acc", value, step)
            writer.add_scalar("perf/train_epoch_s", seconds, 600)
        (run / "tensorboard" / "hparams.yaml").write_text(
            yaml.safe_dump({"model/params": parameters, "model/flops_per_image": 3_000_000})
        )


def test_accuracy_at_a_step_is_linear_between_validations_and_the_last_after_the_run(tmp_path):
    make_runs(tmp_path)
    run = {r.folder.name: r for r in find_runs(tmp_path)}["2"]
    assert accuracy_at_step(run, 250) == pytest.approx(0.6 + 100 / 150 * 0.2)
    assert accuracy_at_step(run, 600) == pytest.approx(0.95)
    assert accuracy_at_step(run, 900) == pytest.approx(0.95)  # it had finished by then
    assert accuracy_at_step(run, 100) is None  # not validated yet


def test_the_section_reads_each_run_at_the_fastest_configurations_training_time(tmp_path):
    make_runs(tmp_path)
    runs = find_runs(tmp_path)
    label_configurations(runs)  # as the comparison does before its sections
    section = cost_and_matched_time(runs, StudyPage(), tmp_path)
    assert "Matched time: 60 s of training, the median of `+arm/routing=fast`" in section
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in section.splitlines() if line.startswith("| +arm")}
    # fast: 0.1 s per step, 600 steps, its final accuracies 90 and 92.
    assert rows["+arm/routing=fast"][1:6] == ["1,000", "3.0", "0.100", "600", "91.00 ± 1.41"]
    # slow: 0.2 and 0.24 s per step (median 0.22): steps 300 and 250 in 60 s, at 80 and 73.33.
    assert rows["+arm/routing=slow"][1:5] == ["2,000", "3.0", "0.220", "273"]
    assert rows["+arm/routing=slow"][5].startswith(f"{(80 + 60 + 100 / 150 * 20) / 2:.2f} ± ")


def test_training_times_of_another_machine_are_not_matched_with_the_others(tmp_path):
    """A configuration run on another machine keeps its step time but gets no accuracy at the matched time,
    however fast it ran there; the page names the machine whose times it compares."""
    make_runs(tmp_path)
    for name in RUNS:
        machine = {"cpu": "AMD EPYC", "cores": 2, "torch": "2.14.1"}
        (tmp_path / name / "machine.yaml").write_text(yaml.safe_dump(machine))
    other = tmp_path / "4"
    (other / ".hydra").mkdir(parents=True)
    (other / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["+arm/routing=elsewhere", "seed=1"]))
    with SummaryWriter(str(other / "tensorboard")) as writer:
        writer.add_scalar("val/acc", 0.5, 600)
        writer.add_scalar("perf/train_epoch_s", 30.0, 600)
    (other / "machine.yaml").write_text(yaml.safe_dump({"cpu": "Intel Xeon", "cores": 2, "torch": "2.14.1"}))
    runs = find_runs(tmp_path)
    label_configurations(runs)
    section = cost_and_matched_time(runs, StudyPage(), tmp_path)
    assert "Matched time: 60 s of training, the median of `+arm/routing=fast`" in section
    assert "the matched time is that of the runs on AMD EPYC, 2 cores, CPU only" in section
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in section.splitlines() if line.startswith("| +arm")}
    assert rows["+arm/routing=elsewhere"][3:6] == ["0.050", "", "another machine"]
    assert rows["+arm/routing=fast"][4:6] == ["600", "91.00 ± 1.41"]
