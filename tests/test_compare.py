"""python -m capsexp.compare: grouping by configuration, mean ± std over seeds, tables and plots."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import pytest
import yaml
from torch.utils.tensorboard import SummaryWriter

from capsexp.compare import main
from capsexp.errors import NoRunsError
from capsexp.results.compare import compare
from capsexp.results.events import last_scalar, load_events

RUNS = {  # run folder: (overrides, val/acc curve, test/acc, rotations)
    "0": (["model=lenet5", "seed=1", "data=rotated_mnist"], [0.90, 0.95], 0.96, {0: 0.96, 45: 0.70}),
    "1": (["model=lenet5", "seed=2", "data=rotated_mnist"], [0.91, 0.97], 0.98, {0: 0.98, 45: 0.74}),
    "2": (
        ["model=capsnet", "seed=1", "hydra.run.dir=somewhere", "data=rotated_mnist"],
        [0.93, 0.99],
        0.99,
        {0: 0.99, 45: 0.85},
    ),
}


def make_runs(folder: Path) -> None:
    for name, (overrides, curve, test_acc, rotations) in RUNS.items():
        run = folder / name
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        writer = SummaryWriter(str(run / "tensorboard"))
        for step, value in enumerate(curve):
            writer.add_scalar("val/acc", value, step * 100)
            writer.add_scalar("val/acc_best", max(curve[: step + 1]), step * 100)
        writer.add_scalar("test/acc", test_acc, 200)
        for angle, value in rotations.items():
            writer.add_scalar(f"test/acc_rot{angle}", value, 200)
        if "model=capsnet" in overrides:  # presence scores: capsule lengths
            writer.add_scalar("val/presence_gap", 0.2, 0)
            writer.add_scalar("val/presence_gap", 0.61, 100)
        writer.close()


def test_groups_seeds_and_matches_the_event_files(tmp_path):
    make_runs(tmp_path / "multirun")
    output = compare(tmp_path / "multirun", tmp_path / "out")
    table = (output / "comparison.md").read_text()
    lenet = next(line for line in table.splitlines() if line.startswith("| model=lenet5 |"))
    cells = [c.strip() for c in lenet.strip("|").split("|")]
    assert cells[1] == "2"
    best_mean = statistics.fmean([0.95, 0.97]) * 100
    best_std = statistics.stdev([0.95, 0.97]) * 100
    assert cells[2] == f"{best_mean:.2f} ± {best_std:.2f}"
    assert "| model=capsnet | 1 |" in table  # the hydra.run.dir override does not split configurations
    capsnet = next(line for line in table.splitlines() if line.startswith("| model=capsnet |"))
    assert "±" not in capsnet  # one run: a mean, no spread
    assert "Common to every run: `data=rotated_mnist`" in table
    with open(output / "comparison.csv") as handle:
        rows = {row["configuration"]: row for row in csv.DictReader(handle)}
    assert float(rows["model=lenet5"]["test/acc_rot45 mean"]) == pytest.approx(0.72, abs=1e-6)
    assert float(rows["model=capsnet"]["test/acc mean"]) == pytest.approx(0.99, abs=1e-6)
    assert list(rows["model=lenet5"])[-4:-2] == ["test/acc_rot45 mean", "test/acc_rot45 std"]  # angles in order
    # The presence gap, where logged: the last validation's, as a fraction (not in %).
    assert float(rows["model=capsnet"]["val/presence_gap mean"]) == pytest.approx(0.61, abs=1e-6)
    assert rows["model=lenet5"]["val/presence_gap mean"] == "nan"
    assert capsnet.rstrip(" |").endswith("| 0.61")
    for plot in ["val_acc.png", "rotation.png"]:
        assert (output / plot).stat().st_size > 1000


def test_command_line_and_empty_folder(tmp_path, capsys):
    make_runs(tmp_path)
    summary = tmp_path / "out" / "summary"
    main([str(tmp_path), "--output", str(summary)])  # folders it makes
    printed = capsys.readouterr().out
    table = (summary / "comparison.md").read_text()
    assert printed == f"{table}\nWritten to {summary}: comparison.md, comparison.csv and the PNG plots.\n"
    assert (summary / "comparison.csv").exists() and not (tmp_path / "comparison.md").exists()
    with pytest.raises(SystemExit):
        main(["--help"])
    usage = capsys.readouterr().out
    assert usage.startswith("usage: python -m capsexp.compare [-h] [--output OUTPUT] folder\n")
    assert "  folder           a multirun folder, or logs/ for every run\n" in usage
    assert "  --output OUTPUT  where to write (default: the folder)\n" in usage
    assert "Finds every run under ``folder`` (a multirun, or all of ``logs/``): a folder with\n" in usage  # as written
    # The library raises the project's error; only main exits, with the message and status 1.
    with pytest.raises(NoRunsError, match="no runs under"):
        compare(tmp_path / "empty")
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "empty")])
    assert exit_info.value.code == 1 and "error: no runs under" in capsys.readouterr().err


def test_last_scalar_reads_the_last_value_logged_and_names_the_tags_a_run_has(tmp_path):
    run = tmp_path / "run"
    with SummaryWriter(run / "tensorboard") as writer:  # where a run writes its events
        for step, value in enumerate([0.5, 0.9, 0.7]):  # the last value, not the best
            writer.add_scalar("val/acc", value, step)
        writer.add_scalar("test/acc", 0.8, 3)
    assert last_scalar(run, "val/acc") == pytest.approx(0.7)
    assert last_scalar(run / "tensorboard", "test/acc") == pytest.approx(0.8)  # the event folder itself
    with pytest.raises(KeyError, match=r"val/loss was not logged in \S+run \(it has: test/acc, val/acc\)"):
        last_scalar(run, "val/loss")
    (tmp_path / "empty").mkdir()
    with pytest.raises(KeyError, match=r"it has: no scalars"):
        last_scalar(tmp_path / "empty", "val/acc")


def test_the_plots_draw_each_runs_curve_and_each_configurations_accuracy_per_angle(tmp_path, monkeypatch):
    """What the figures hold, read from the matplotlib figures as they are saved: the validation curve of
    every run in % (a colour and one legend entry per configuration), and per configuration the mean
    test accuracy at each angle with the seeds' std as error bars."""
    import matplotlib.figure

    saved = {}
    save = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(
        matplotlib.figure.Figure,
        "savefig",
        lambda self, path, **kw: (saved.update({Path(path).name: self}), save(self, path, **kw)),
    )
    make_runs(tmp_path / "multirun")
    compare(tmp_path / "multirun", tmp_path / "out")
    assert sorted(saved) == ["rotation.png", "val_acc.png"]

    (axes,) = saved["val_acc.png"].axes
    assert (axes.get_xlabel(), axes.get_ylabel(), axes.get_title()) == (
        "step",
        "validation accuracy (%)",
        "Validation accuracy",
    )
    curves = [(list(line.get_xdata()), list(line.get_ydata()), line.get_color()) for line in axes.get_lines()]
    assert len(curves) == len(RUNS) and all(x == [0, 100] for x, _, _ in curves)
    colour = {}
    for name, (_, curve, _, _) in RUNS.items():
        (colour[name],) = [c for _, y, c in curves if y == pytest.approx([100 * v for v in curve])]
    assert colour["0"] == colour["1"] != colour["2"]  # the seeds of a configuration share a colour
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    assert legend == ["model=lenet5", "model=capsnet"]

    (axes,) = saved["rotation.png"].axes
    assert (axes.get_xlabel(), axes.get_ylabel(), axes.get_title()) == (
        "rotation of the test digits (degrees)",
        "test accuracy (%)",
        "Accuracy versus rotation",
    )
    bars = {container.get_label(): container for container in axes.containers}
    assert sorted(bars) == ["model=capsnet", "model=lenet5"]
    lenet_line, _, (lenet_bars,) = bars["model=lenet5"].lines
    assert list(lenet_line.get_xdata()) == [0, 45]
    assert list(lenet_line.get_ydata()) == pytest.approx([97.0, 72.0], abs=1e-4)
    spread = [statistics.stdev([96, 98]), statistics.stdev([70, 74])]
    segments = lenet_bars.get_segments()  # one vertical segment per angle: mean - std to mean + std
    assert [s[1][1] - s[0][1] for s in segments] == pytest.approx([2 * x for x in spread], abs=1e-4)  # float32 events
    assert lenet_line.get_color() == colour["0"]  # each configuration's colour in both figures
    capsnet_line, _, (capsnet_bars,) = bars["model=capsnet"].lines
    assert capsnet_line.get_color() == colour["2"]
    assert list(capsnet_line.get_ydata()) == pytest.approx([99.0, 85.0], abs=1e-4)
    assert [s[1][1] - s[0][1] for s in capsnet_bars.get_segments()] == [0, 0]  # one run: no spread


def test_the_page_and_the_table_as_written(tmp_path):
    make_runs(tmp_path / "multirun")
    output = compare(tmp_path / "multirun", tmp_path / "out")
    assert (output / "comparison.md").read_text() == (
        "# Run comparison\n\n"
        "Accuracies in %, mean ± std over the runs of each configuration (they differ only by seed; no std for a "
        "single run). Final values, except val/acc_best. val/presence_gap, where logged: the median over the "
        "validation images of the target class's score minus the largest other's, at the last validation "
        "(not in %).\n\n"
        "Common to every run: `data=rotated_mnist`\n\n"
        "| configuration | runs | val/acc_best | val/acc | test/acc | test/acc_rot0 | test/acc_rot45 "
        "| val/presence_gap |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
        "| model=capsnet | 1 | 99.00 | 99.00 | 99.00 | 99.00 | 85.00 | 0.61 |\n"
        "| model=lenet5 | 2 | 96.00 ± 1.41 | 96.00 ± 1.41 | 97.00 ± 1.41 | 97.00 ± 1.41 | 72.00 ± 2.83 |  |\n"
    )
    header = (output / "comparison.csv").read_text().splitlines()[0]
    assert header.startswith("configuration,runs,val/acc_best mean,val/acc_best std,val/acc mean,")


def test_runs_are_found_past_folders_that_are_not_runs_and_angles_sort_by_degrees(tmp_path):
    """A folder with overrides but no event files (a job that failed at start) is passed over; a run
    without overrides is "(defaults)"; runs without a validation curve are left out of its plot only;
    rotations sort as numbers (0, 45, 180)."""
    folder = tmp_path / "multirun"
    (folder / "0" / ".hydra").mkdir(parents=True)  # sorted first, not a run
    (folder / "0" / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["model=lenet5"]))
    for name, overrides, curve in [("1", [], []), ("2", ["model=lenet5"], [0.5, 0.6])]:
        (folder / name / ".hydra").mkdir(parents=True)
        (folder / name / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        with SummaryWriter(str(folder / name / "tensorboard")) as writer:
            for step, value in enumerate(curve):
                writer.add_scalar("val/acc", value, step)
            for angle in (180, 0, 45) if overrides else (0, 45):  # the run without overrides lacks 180
                writer.add_scalar(f"test/acc_rot{angle}", 0.5, 0)
    output = compare(folder, tmp_path / "out")
    table = (output / "comparison.md").read_text()
    assert "| (defaults) | 1 |" in table and "| model=lenet5 | 1 |" in table  # a run with no overrides
    assert "| test/acc_rot0 | test/acc_rot45 | test/acc_rot180 |" in table
    assert "| (defaults) | 1 |  | 50.00 | 50.00 |  |" in table and (output / "rotation.png").exists()
    assert (output / "val_acc.png").exists()  # lenet5's curve, after a run that has none


def test_a_single_configuration_is_labelled_by_its_overrides(tmp_path):
    folder = tmp_path / "multirun"
    for seed in (1, 2):
        (folder / str(seed) / ".hydra").mkdir(parents=True)
        (folder / str(seed) / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["model=lenet5", f"seed={seed}"]))
        with SummaryWriter(str(folder / str(seed) / "tensorboard")) as writer:
            writer.add_scalar("test/acc", 0.9, 0)
    table = (compare(folder, tmp_path / "out") / "comparison.md").read_text()
    assert table.endswith(
        "(not in %).\n\n| configuration | runs | test/acc |\n| --- | ---: | ---: |\n"
        "| model=lenet5 | 2 | 90.00 ± 0.00 |\n"
    )


def test_every_scalar_of_a_long_run_is_read_back(tmp_path):
    """TensorBoard's reader keeps a sample of 10,000 scalars per tag unless told otherwise."""
    with SummaryWriter(str(tmp_path / "tensorboard")) as writer:
        for step in range(10_050):
            writer.add_scalar("train/loss", float(step), step)
    points = load_events(tmp_path).Scalars("train/loss")
    assert [point.step for point in points] == list(range(10_050))
