"""python -m capsexp.compare: grouping by configuration, mean ± std over seeds, tables and plots."""

from __future__ import annotations

import csv
import math
import shutil
import statistics
from pathlib import Path

import pytest
import yaml
from torch.utils.tensorboard import SummaryWriter

from capsexp.compare import main
from capsexp.errors import ConfigError, NoRunsError
from capsexp.records.events import last_scalar, load_events
from capsexp.results.compare import compare
from capsexp.testing import assert_page_rebuilds

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
RUNS_START = 1795564800  # 2026-11-25 00:00 UTC
LOGIT_INTERVAL = (
    "Student's t on the logit scale, mapped back into 0-100 %; cut to that range where a run scored 0 or 100 %"
)


def accuracy_interval(percents: list[float]) -> tuple[float, float]:
    """An accuracy's 95% interval by hand: the t interval of the mean of the logits, log(p / (1 - p)),
    mapped back by 100 / (1 + e^-x)."""
    from scipy import stats

    logits = [math.log(p / (100 - p)) for p in percents]
    half = stats.t.ppf(0.975, len(logits) - 1) * statistics.stdev(logits) / math.sqrt(len(logits))
    mean = statistics.fmean(logits)
    return 100 / (1 + math.exp(-(mean - half))), 100 / (1 + math.exp(-(mean + half)))


def make_runs(folder: Path) -> None:
    for name, (overrides, curve, test_acc, rotations) in RUNS.items():
        run = folder / name
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        writer = SummaryWriter(str(run / "tensorboard"))
        start = RUNS_START + 600 * int(name)  # each run 90 s long, one after another
        for step, value in enumerate(curve):
            writer.add_scalar("val/acc", value, step * 100, walltime=start + 30 * step)
            writer.add_scalar("val/acc_best", max(curve[: step + 1]), step * 100, walltime=start + 30 * step)
        writer.add_scalar("test/acc", test_acc, 200, walltime=start + 90)
        for angle, value in rotations.items():
            writer.add_scalar(f"test/acc_rot{angle}", value, 200, walltime=start + 90)
        if "model=capsnet" in overrides:  # presence scores: capsule lengths
            writer.add_scalar("val/presence_gap", 0.2, 0, walltime=start)
            writer.add_scalar("val/presence_gap", 0.61, 100, walltime=start + 30)
        writer.close()


def test_groups_seeds_and_matches_the_event_files(tmp_path):
    make_runs(tmp_path / "multirun")
    output = compare(tmp_path / "multirun", tmp_path / "out").output
    page = (output / "README.md").read_text()
    lenet = next(line for line in page.splitlines() if line.startswith("| model=lenet5 |"))
    cells = [c.strip() for c in lenet.strip("|").split("|")]
    assert cells[1] == "2"
    test_mean, test_std = statistics.fmean([0.96, 0.98]) * 100, statistics.stdev([0.96, 0.98]) * 100
    low, high = accuracy_interval([96, 98])  # within 0-100 %: the plain t interval reaches 109.71
    assert cells[2] == f"{test_mean:.2f} ± {test_std:.2f} [{low:.2f}, {high:.2f}]"
    best_mean = statistics.fmean([0.95, 0.97]) * 100
    best_std = statistics.stdev([0.95, 0.97]) * 100
    assert cells[3] == f"{best_mean:.2f} ± {best_std:.2f}"
    assert "| model=capsnet | 1 |" in page  # the hydra.run.dir override does not split configurations
    capsnet = next(line for line in page.splitlines() if line.startswith("| model=capsnet |"))
    assert "±" not in capsnet  # one run: a mean, no spread
    assert "Common to every run: `data=rotated_mnist`" in page
    with open(output / "comparison.csv") as handle:
        rows = {row["configuration"]: row for row in csv.DictReader(handle)}
    assert float(rows["model=lenet5"]["test/acc_rot45 mean"]) == pytest.approx(0.72, abs=1e-6)
    assert float(rows["model=lenet5"]["test/acc ci_high"]) == pytest.approx(high / 100, abs=1e-6)
    assert float(rows["model=capsnet"]["test/acc mean"]) == pytest.approx(0.99, abs=1e-6)
    assert rows["model=capsnet"]["test/acc std"] == rows["model=capsnet"]["test/acc ci_low"] == "nan"
    rotation_columns = [c for c in rows["model=lenet5"] if "rot" in c and c.endswith("mean")]
    assert rotation_columns == ["test/acc_rot0 mean", "test/acc_rot45 mean"]  # angles in order
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
    page = (summary / "README.md").read_text()
    assert printed == f"{page}\nWritten to {summary}: README.md, comparison.csv and the PNG plots.\n"
    assert (summary / "comparison.csv").exists() and not (tmp_path / "README.md").exists()
    with pytest.raises(SystemExit):
        main(["--help"])
    usage = capsys.readouterr().out
    assert " ".join(usage.split()).startswith(
        "usage: python -m capsexp.compare [-h] [--output OUTPUT] [--keep-runs] [--check] folder"
    )
    assert "a multirun folder, a study's runs, or logs/ for every run" in usage
    assert "  --output OUTPUT  where to write (default: the folder)\n" in usage
    assert "Finds every run under ``folder`` (a multirun, a study's runs, or all of ``logs/``)" in usage  # as written
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


def saved_figures(monkeypatch) -> dict:
    """The matplotlib figures the next calls save, by file name, read as they are saved."""
    import matplotlib.figure

    saved = {}
    save = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(
        matplotlib.figure.Figure,
        "savefig",
        lambda self, path, **kw: (saved.update({Path(path).name: self}), save(self, path, **kw)),
    )
    return saved


def test_the_plots_draw_each_configurations_runs_mean_curve_with_its_band_and_its_accuracy_per_angle(
    tmp_path, monkeypatch
):
    """What the figures hold, read from the matplotlib figures as they are saved. The headline figure
    first: per configuration each run's test accuracy as a dot, the mean and its 95% interval, sorted with
    the best at the top, the reference named; then the mean validation curve over its runs in %, a marker
    at each validation, a band of ± one std where it has several runs; and the mean test accuracy at each
    angle with its 95% interval."""
    saved = saved_figures(monkeypatch)
    make_runs(tmp_path / "multirun")
    compare(tmp_path / "multirun", tmp_path / "out")
    assert sorted(saved) == ["differences.png", "headline.png", "rotation.png", "val_acc.png"]
    page = (tmp_path / "out" / "README.md").read_text()
    assert page.index("![differences](differences.png)") < page.index("## Results")
    assert page.index("## Results") < page.index("![headline](headline.png)") < page.index("![val_acc](val_acc.png)")

    # The differences first: capsnet (one run) minus lenet5 (two), +2 points, a diamond without interval.
    (axes,) = saved["differences.png"].axes
    assert axes.get_xlabel() == "test/acc, difference (points)"
    assert [tick.get_text() for tick in axes.get_yticklabels()] == ["model=capsnet"]
    diamond = next(line for line in axes.get_lines() if line.get_marker() == "D")
    assert list(diamond.get_xdata()) == pytest.approx([2.0], abs=1e-4)
    title = saved["differences.png"]._suptitle.get_text()
    assert title.startswith("Each comparison minus model=lenet5: the mean difference and its 95% interval")
    assert all(len(line) <= 150 for line in title.split("\n")) and "\n" in title  # wrapped to the figure

    (axes,) = saved["headline.png"].axes
    assert axes.get_xlabel() == "test/acc (%)"
    labels = [tick.get_text() for tick in axes.get_yticklabels()]
    assert labels == ["model=lenet5 (reference)", "model=capsnet"]  # the best (99%) at the top
    assert axes.get_yticklabels()[0].get_fontweight() == "bold"
    lenet_dots, capsnet_dots = axes.collections
    assert sorted(lenet_dots.get_offsets()[:, 0]) == pytest.approx([96.0, 98.0], abs=1e-4)  # each run
    assert list(capsnet_dots.get_offsets()[:, 0]) == pytest.approx([99.0], abs=1e-4)
    low, high = accuracy_interval([96, 98])
    interval = next(line for line in axes.get_lines() if len(line.get_xdata()) == 2)
    assert list(interval.get_xdata()) == pytest.approx([low, high], abs=1e-3)
    assert [t.get_text() for t in axes.texts] == [f"97.00 [{low:.2f}, {high:.2f}]", "99.00"]
    assert axes.get_xlim()[0] >= 0 and axes.get_xlim()[1] <= 100  # no axis past what accuracy can be
    assert LOGIT_INTERVAL in saved["headline.png"]._suptitle.get_text().replace("\n", " ")

    (axes,) = saved["val_acc.png"].axes
    assert (axes.get_xlabel(), axes.get_ylabel(), axes.get_title()) == (
        "step",
        "validation accuracy (%)",
        "Validation accuracy at each validation (mean over seeds, band ± one std)",
    )
    lenet_line, capsnet_line = axes.get_lines()
    assert list(lenet_line.get_xdata()) == [0, 100]
    assert lenet_line.get_marker() != "None" and lenet_line.get_marker() != capsnet_line.get_marker()
    assert list(lenet_line.get_ydata()) == pytest.approx([90.5, 96.0], abs=1e-4)  # the two seeds' mean
    assert list(capsnet_line.get_ydata()) == pytest.approx([93.0, 99.0], abs=1e-4)
    colour = {"lenet5": lenet_line.get_color(), "capsnet": capsnet_line.get_color()}
    assert colour["lenet5"] != colour["capsnet"]
    (band,) = axes.collections  # lenet5's two runs; capsnet's single run has none
    (outline,) = band.get_paths()
    spread = [statistics.stdev([90, 91]), statistics.stdev([95, 97])]
    ys = outline.vertices[:, 1]
    assert max(ys) == pytest.approx(96.0 + spread[1], abs=1e-3) and min(ys) == pytest.approx(90.5 - spread[0], abs=1e-3)
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    assert legend == ["model=lenet5 (2 runs)", "model=capsnet (1 run)"]

    (axes,) = saved["rotation.png"].axes
    assert (axes.get_xlabel(), axes.get_ylabel(), axes.get_title().replace("\n", " ")) == (
        "rotation of the test digits (degrees)",
        "test accuracy (%)",
        f"Accuracy versus rotation (mean and its 95% confidence interval over seeds, {LOGIT_INTERVAL})",
    )
    bars = {container.get_label(): container for container in axes.containers}
    assert sorted(bars) == ["model=capsnet", "model=lenet5"]
    lenet_line, _, (lenet_bars,) = bars["model=lenet5"].lines
    assert list(lenet_line.get_xdata()) == [0, 45]
    assert list(lenet_line.get_ydata()) == pytest.approx([97.0, 72.0], abs=1e-4)
    # One vertical segment per angle: the 95% interval of the mean of two runs, on the logit scale.
    segments = lenet_bars.get_segments()
    intervals = [accuracy_interval(pair) for pair in ([96, 98], [70, 74])]
    assert [(s[0][1], s[1][1]) for s in segments] == [pytest.approx(i, abs=1e-3) for i in intervals]  # float32
    assert axes.get_ylim()[0] >= 0 and axes.get_ylim()[1] <= 100
    assert lenet_line.get_color() == colour["lenet5"]  # each configuration's colour in both figures
    capsnet_line, _, (capsnet_bars,) = bars["model=capsnet"].lines
    assert capsnet_line.get_color() == colour["capsnet"]
    assert list(capsnet_line.get_ydata()) == pytest.approx([99.0, 85.0], abs=1e-4)
    assert [s[1][1] - s[0][1] for s in capsnet_bars.get_segments()] == [0, 0]  # one run: no interval


def test_learning_curves_of_many_configurations_get_a_panel_each_so_that_none_hides_another(tmp_path, monkeypatch):
    """Three configurations whose curves coincide: each has its own panel, its curve in colour with a
    marker at each validation and the others in grey; a title that names no band for single runs."""
    saved = saved_figures(monkeypatch)
    for job, arm in enumerate(("a", "b", "c")):
        run = tmp_path / "sweep" / str(job)
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"arm={arm}"]))
        with SummaryWriter(str(run)) as writer:
            for step, value in ((100, 0.5), (200, 0.7)):
                writer.add_scalar("val/acc", value, step, walltime=RUNS_START + step)
    compare(tmp_path / "sweep")
    figure = saved["val_acc.png"]
    panels = [axes for axes in figure.axes if axes.get_visible()]
    assert [axes.get_title() for axes in panels] == ["arm=a (1 run)", "arm=b (1 run)", "arm=c (1 run)"]
    for axes in panels:
        *others, own = axes.get_lines()
        assert len(others) == 2 and all(line.get_color() == "0.8" for line in others)
        assert own.get_marker() == "o" and list(own.get_ydata()) == pytest.approx([50.0, 70.0])
    assert figure._suptitle.get_text().startswith("Validation accuracy at each validation (one run each)")


def _log(folder: Path, points: list[tuple[int, float]], opened: int, writer: str) -> None:
    """Scalars as one process logs them: an event file named as TensorBoard's writer names it, for a
    process ``writer`` (``<host>.<pid>``) that opened it at ``opened``."""
    with SummaryWriter(str(folder)) as log:
        for step, seconds in points:
            log.add_scalar("val/acc", 0.5, step, walltime=RUNS_START + seconds)
        written = Path(log.file_writer.event_writer._file_name)
    written.rename(folder / f"events.out.tfevents.{RUNS_START + opened}.{writer}.0")


def test_a_run_stopped_and_resumed_is_not_timed_while_it_was_stopped(tmp_path):
    """A run logged by one process for 120 s, stopped, and resumed 20 min later by another (on a host whose
    name holds dots) for 90 s, counts 210 s; a run never stopped, its first to last scalar (60 s). The
    header says how many were resumed."""
    for job, processes in enumerate(
        (
            [([(0, 5), (100, 125)], 5, "vm.100"), ([(100, 1205), (200, 1295)], 1205, "node1.lab.org.200")],
            [([(0, 10), (200, 70)], 10, "vm.300")],
        )
    ):
        run = tmp_path / "sweep" / str(job)
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"seed={job}"]))
        for points, opened, writer in processes:
            _log(run, points, opened, writer)
    header = (compare(tmp_path / "sweep").output / "README.md").read_text().splitlines()
    assert (
        "- Runs: 2, 2026-11-25, 4.5 min of run time (each run's first to last logged scalar in each of its "
        "processes: the wait of 1 run between a stop and its resumption is not counted); in this folder."
    ) in header


def test_the_page_and_the_table_as_written(tmp_path):
    make_runs(tmp_path / "multirun")
    output = compare(tmp_path / "multirun").output
    low, high = accuracy_interval([96, 98])
    assert (output / "README.md").read_text() == (
        "# Run comparison\n\n"
        "- Machine: not recorded for 3 runs.\n"
        "- Runs: 3, 2026-11-25, 4.5 min of run time (each run's first to last logged scalar); in this folder.\n"
        "- Command: `python -m capsexp -m model=lenet5,capsnet seed=1,2 data=rotated_mnist`\n"
        "- Rebuild this page, in its folder: `python -m capsexp.compare .`\n\n"
        "![differences](differences.png)\n\n"
        "## Results\n\n"
        "Per configuration (runs that differ only by seed): test/acc as mean ± std over the runs with the 95% "
        f"confidence interval of the mean ({LOGIT_INTERVAL}), the other metrics as mean ± std (a mean alone for one "
        "run). "
        "Accuracies in %, final values except val/acc_best; val/presence_gap, where logged: the median over the "
        "validation images of the target class's score minus the largest other's, at the last validation.\n\n"
        "Common to every run: `data=rotated_mnist`\n\n"
        "![headline](headline.png)\n\n"
        "| configuration | runs | test/acc (95% CI) | val/acc_best | val/acc | test/acc_rot0 | test/acc_rot45 "
        "| val/presence_gap |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
        f"| model=lenet5 | 2 | 97.00 ± 1.41 [{low:.2f}, {high:.2f}] | 96.00 ± 1.41 | 96.00 ± 1.41 | 97.00 ± 1.41 "
        "| 72.00 ± 2.83 |  |\n"
        "| model=capsnet | 1 | 99.00 | 99.00 | 99.00 | 99.00 | 85.00 | 0.61 |\n\n"
        "## Against `model=lenet5`\n\n"
        "Each configuration minus `model=lenet5`, in points of accuracy (the presence gap in score), with the 95% "
        "confidence interval of the difference: paired by seed where the two share their seeds, Welch's otherwise. "
        "No comparison has 5 runs a side: too few seeds to test, so none is tested; the differences and their "
        "intervals only.\n\n"
        "| configuration | runs | difference | 95% CI |\n"
        "| --- | ---: | ---: | ---: |\n"
        "| model=capsnet | 1 / 2 | +2.00 |  |\n\n"
        "## Presence and routing\n\n"
        "The last values logged, mean ± std over the runs: the presence scores of the last validation, the "
        "routing measures of the last training step that logged them. Presence gap: the median over the "
        "validation images of the target class's score minus the largest other's (scores that signal presence "
        "keep it well above 0). Entropy: of each child's routing assignment over its parents, normalised "
        "(1 uniform: no routing; 0 each child to one parent). Spread across inputs: the std of each parent "
        "capsule's activation across a batch's images, averaged over capsules (near 0: the capsule ignores its "
        "input).\n\n"
        "| configuration | presence gap | target / largest other |\n"
        "| --- | ---: | ---: |\n"
        "| model=lenet5 |  |  |\n"
        "| model=capsnet | 0.61 |  |\n\n"
        "![val_acc](val_acc.png)\n"
        "![rotation](rotation.png)\n"
    )
    header = (output / "comparison.csv").read_text().splitlines()[0]
    assert header.startswith("configuration,runs,val/acc_best mean,val/acc_best std,val/acc_best ci_low,")


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
    output = compare(folder, tmp_path / "out").output
    table = (output / "README.md").read_text()
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
    table = (compare(folder, tmp_path / "out").output / "README.md").read_text()
    assert table.endswith(
        "at the last validation.\n\n| configuration | runs | test/acc (95% CI) |\n| --- | ---: | ---: |\n"
        "| model=lenet5 | 2 | 90.00 ± 0.00 [90.00, 90.00] |\n"
    )
    assert "## Against" not in table  # nothing to compare with


def test_every_scalar_of_a_long_run_is_read_back(tmp_path):
    """TensorBoard's reader keeps a sample of 10,000 scalars per tag unless told otherwise."""
    with SummaryWriter(str(tmp_path / "tensorboard")) as writer:
        for step in range(10_050):
            writer.add_scalar("train/loss", float(step), step)
    points = load_events(tmp_path).Scalars("train/loss")
    assert [point.step for point in points] == list(range(10_050))


EXPERIMENT = """\
# @package _global_
budgets:
  quick: {epochs: 1}
hydra:
  sweeper:
    params: {iterations: "1,3", reconstruction: "true,false"}
page:
  title: "Routing and reconstruction"
  reference: iterations=3 reconstruction=true
  notes:
    quick: |
      Three steps.
  paper:
    source: "Paper, Table 1"
    metric: test error (%)
    error: true
    figures:
      iterations=1: "0.34"
      iterations=3 reconstruction=true: "0.25"
  expected:
    quick:
      tolerance: 0.01
      figures:
        iterations=1 reconstruction=true: 0.955
        iterations=3 reconstruction=true: {mean: 0.975, std: 0.003, runs: 2}  # within 2 x 0.003 x sqrt(2 / 2)
        iterations=3 reconstruction=false: {mean: 0.975, std: 0.003, runs: 2}
"""


def make_study(folder: Path, accuracies: dict[tuple[str, ...], list[float]]) -> None:
    """Runs of ``experiment=toy study=quick``: each configuration's runs with seeds 1, 2, ..."""
    job = 0
    for setting, values in accuracies.items():
        for seed, value in enumerate(values, start=1):
            run = folder / str(job)
            (run / ".hydra").mkdir(parents=True)
            overrides = [*setting, f"seed={seed}", "experiment=toy", "study=quick", f"hydra.sweep.dir={folder}"]
            (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
            (run / "machine.yaml").write_text("cpu: Toy CPU\ncores: 2\ngpus: []\ntorch: 2.14.1\n")
            with SummaryWriter(str(run / "tensorboard")) as writer:
                writer.add_scalar("val/acc", value - 0.01, 100, walltime=RUNS_START + 3600 * job)
                writer.add_scalar("test/acc", value, 100, walltime=RUNS_START + 3600 * job + 120)
            job += 1


def test_an_experiments_page_its_paper_figures_statistics_and_reproduction_check(tmp_path, monkeypatch, capsys):
    """Runs of an experiment config get its page: the title and notes of their budget, the paper's
    figures beside ours (errors beside errors), each configuration against the page's reference with the
    interval of the paired difference (they share seeds 1 and 2; too few to test), and the check of
    the figures the budget gave before (``--check`` fails when one is out of tolerance)."""

    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "toy.yaml").write_text(EXPERIMENT)
    monkeypatch.setattr("capsexp.locations.CONFIG_DIR", tmp_path / "conf")
    accuracies = {
        ("iterations=1", "reconstruction=true"): [0.95, 0.96],
        ("iterations=3", "reconstruction=true"): [0.97, 0.99],
        ("iterations=3", "reconstruction=false"): [0.96, 0.97],
    }
    make_study(tmp_path / "sweep", accuracies)
    result = compare(tmp_path / "sweep")
    page = (result.output / "README.md").read_text()
    assert page.startswith(
        "# Routing and reconstruction (study=quick)\n\n- Machine: Toy CPU, 2 cores, CPU only, torch 2.14.1.\n"
        "- Runs: 6, 2026-11-25, 12.0 min of run time"
    )
    assert (
        "- Command: `python -m capsexp -m iterations=1,3 reconstruction=true,false seed=1,2 experiment=toy study=quick`"
        in page
    )
    assert "\nThree steps.\n" in page
    results = page[page.index("## Results") : page.index("## Against")]
    assert (
        "| configuration | runs | test/acc (95% CI) | val/acc | test/acc as error (%) | paper: test error (%) |"
        in results
    )
    rows = {line.split(" | ")[0][2:]: line for line in results.splitlines() if line.startswith("| iterations=")}
    assert rows["iterations=1 reconstruction=true"].endswith("| 4.50 | 0.34 |")  # 100 - 95.5, beside the paper's
    assert rows["iterations=3 reconstruction=true"].endswith("| 2.00 | 0.25 |")
    assert rows["iterations=3 reconstruction=false"].endswith("| 3.50 |  |")  # no paper figure for it
    # Against the reference (iterations=3 reconstruction=true), paired by seed: differences -2 and -3
    # points (mean -2.5, sd sqrt(0.5)): an interval, and 2 seeds are too few to test.
    against = page[page.index("## Against `iterations=3 reconstruction=true`") :]
    low, high = -2.5 - 12.706205 * 0.5, -2.5 + 12.706205 * 0.5  # t_{0.975, 1} x standard error 0.5
    assert f"| iterations=1 reconstruction=true | 2 / 2 | -2.50 | [{low:.2f}, {high:.2f}] |" in against
    assert "No comparison has 5 runs a side: too few seeds to test" in against and "Holm" not in against
    # The reproduction check: iterations=1 expected 95.5 within the budget's 1 point (here 95.5), both
    # iterations=3 rows 97.5 within 0.6 points, from their two runs' std and our two: 98.0 within, 96.5 not.
    assert "| iterations=1 reconstruction=true | 95.50 (1) | ±1.00 | 95.50 (2) | yes |" in page
    assert "| iterations=3 reconstruction=true | 97.50 (2) | ±0.60 | 98.00 (2) | yes |" in page
    assert "| iterations=3 reconstruction=false | 97.50 (2) | ±0.60 | 96.50 (2) | **no** |" in page
    assert "3 configurations checked against the figures of a page of the project." in page
    assert result.failed == ["iterations=3 reconstruction=false"]
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "sweep"), "--check"])
    assert exit_info.value.code == 1
    assert "outside the expected figures' tolerance: iterations=3 reconstruction=false" in capsys.readouterr().err


def test_runs_given_other_settings_than_the_studys_are_not_checked_against_its_figures(tmp_path, monkeypatch):

    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "toy.yaml").write_text(EXPERIMENT)
    monkeypatch.setattr("capsexp.locations.CONFIG_DIR", tmp_path / "conf")
    accuracies = {
        ("iterations=1", "reconstruction=true"): [0.95],
        ("iterations=1", "reconstruction=true", "trainer.max_steps=5"): [0.5],  # a user's shorter run
        ("iterations=3",): [0.5],  # not a job of the study: the figures name both of its settings
    }
    make_study(tmp_path / "sweep", accuracies)
    result = compare(tmp_path / "sweep")
    check = (result.output / "README.md").read_text().split("## Reproduction check (study=quick)")[1]
    rows = [line for line in check.splitlines() if line.startswith("| iterations=")]
    assert rows == ["| iterations=1 reconstruction=true | 95.50 (1) | ±1.00 | 95.00 (1) | yes |"]
    assert result.failed == []


def test_an_expected_figure_without_a_tolerance_is_a_config_error(tmp_path, monkeypatch):
    from capsexp.results import study

    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    without = EXPERIMENT.replace("      tolerance: 0.01\n", "")  # iterations=1's figure is of one run
    (tmp_path / "conf" / "experiment" / "toy.yaml").write_text(without)
    monkeypatch.setattr("capsexp.locations.CONFIG_DIR", tmp_path / "conf")
    message = r"toy.yaml: its page is malformed .*'iterations=1 reconstruction=true' is of one run"
    with pytest.raises(ConfigError, match=message):
        study.load_study_page("toy", "quick")


def test_a_page_with_its_runs_kept_beside_it_rebuilds_byte_identical(tmp_path):
    make_study(tmp_path / "logs" / "sweep", {("model=lenet5",): [0.9, 0.92], ("model=capsnet",): [0.95, 0.96]})
    multirun = {"hydra": {"overrides": {"task": ["experiment=toy", "study=quick", f"hydra.sweep.dir={tmp_path}"]}}}
    (tmp_path / "logs" / "sweep" / "multirun.yaml").write_text(yaml.safe_dump(multirun))  # Hydra's record
    (tmp_path / "logs" / "sweep" / "0" / "checkpoints").mkdir()  # not copied: only what the page needs
    (tmp_path / "logs" / "sweep" / "0" / "checkpoints" / "last.ckpt").write_text("weights")
    page_folder = tmp_path / "results" / "toy_quick"
    main([str(tmp_path / "logs" / "sweep"), "--output", str(page_folder), "--keep-runs"])
    kept = sorted(str(p.relative_to(page_folder)) for p in page_folder.rglob("*") if p.is_file())
    page_files = ["README.md", "comparison.csv", "differences.png", "headline.png", "val_acc.png"]
    assert [p for p in kept if not p.startswith("runs/")] == page_files
    assert [p for p in kept if p.startswith("runs/0/")][:2] == ["runs/0/.hydra/overrides.yaml", "runs/0/machine.yaml"]
    kept_overrides = yaml.safe_load((page_folder / "runs/0/.hydra/overrides.yaml").read_text())
    assert kept_overrides == ["model=lenet5", "seed=1", "experiment=toy", "study=quick"]  # no hydra.sweep.dir=<path>
    assert not any("checkpoints" in p for p in kept)
    page = (page_folder / "README.md").read_text()
    assert (
        "; in `runs/`.\n" in page
        and "Rebuild this page, in its folder: `python -m capsexp.compare runs --output .`" in page
    )
    # The page and table rebuilt from the kept runs alone, elsewhere, are the same bytes.
    moved = tmp_path / "elsewhere"
    shutil.rmtree(tmp_path / "logs")
    assert_page_rebuilds(page_folder, moved)
    # A page whose table (not its README) no longer matches its runs fails the check, naming the file.
    table = (page_folder / "comparison.csv").read_text()
    (page_folder / "comparison.csv").write_text(table.replace("0.9", "0.8", 1))
    with pytest.raises(AssertionError, match=r"comparison\.csv"):
        assert_page_rebuilds(page_folder, tmp_path / "again")
    main([str(moved / "runs"), "--output", str(moved), "--keep-runs"])  # from the kept runs: they stay
    assert len(list((moved / "runs").glob("*/tensorboard"))) == 4
    # Kept again from another sweep: the earlier runs go, the page is of this sweep's runs alone.
    make_study(tmp_path / "other", {("model=lenet5",): [0.5]})
    main([str(tmp_path / "other"), "--output", str(moved), "--keep-runs"])
    assert sorted(p.name for p in (moved / "runs").iterdir()) == ["0", "order.yaml"]


def test_a_users_two_seed_sweep_gets_intervals_and_says_it_is_too_few_to_test(tmp_path, capsys):
    """``python -m capsexp -m model=lenet5,capsnet seed=1,2`` as a user runs it, then the one command:
    both models ran seeds 1 and 2, so CapsNet is compared with LeNet5 (the first) by the interval of the
    paired difference, and not tested: two seeds a side cannot support a test."""
    accuracies = {("model=lenet5",): [0.90, 0.93], ("model=capsnet",): [0.95, 0.99]}
    job = 0
    for (setting,), values in accuracies.items():
        for seed, value in enumerate(values, start=1):
            run = tmp_path / "sweep" / str(job)
            (run / ".hydra").mkdir(parents=True)
            (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([setting, f"seed={seed}"]))
            with SummaryWriter(str(run / "tensorboard")) as writer:
                writer.add_scalar("test/acc", value, 10, walltime=RUNS_START + 60 * job)
            job += 1
    main([str(tmp_path / "sweep")])
    page = capsys.readouterr().out
    assert (
        page.startswith("# Run comparison\n")
        and "- Command: `python -m capsexp -m model=lenet5,capsnet seed=1,2`" in page
    )
    low, high = accuracy_interval([95.0, 99.0])  # the plain t interval: [71.59, 122.41]
    assert f"| model=capsnet | 2 | 97.00 ± 2.83 [{low:.2f}, {high:.2f}] |" in page and high < 100
    # Per-seed differences 5 and 6 points: mean 5.5, standard error 0.5 on 1 degree of freedom.
    low, high = 5.5 - 12.706205 * 0.5, 5.5 + 12.706205 * 0.5
    assert f"| model=capsnet | 2 / 2 | +5.50 | [{low:.2f}, {high:.2f}] |\n" in page
    assert "too few seeds to test" in page and "significant" not in page


def test_the_machine_line_names_the_cpus_vector_instructions_where_recorded():
    from capsexp.records.machine import describe, describe_text

    recorded = {"cpu": "AMD EPYC", "cpu_capability": "AVX2", "cores": 2, "gpus": ["NVIDIA A100"] * 2, "torch": "2.14.1"}
    assert describe_text(recorded) == "AMD EPYC (AVX2), 2 cores, 2 x NVIDIA A100, torch 2.14.1"
    del recorded["cpu_capability"]  # a record written before it was kept
    assert describe_text({**recorded, "gpus": []}) == "AMD EPYC, 2 cores, CPU only, torch 2.14.1"
    assert describe()["cpu_capability"] in ("DEFAULT", "AVX2", "AVX512", "ZVECTOR", "VSX", "NEON", "SVE256")


TWO_REFERENCES = """
page:
  title: Two references
  metric: [test/acc, val/acc]
  reference: [arm=uniform, arm=dynamic]
  notes: {quick: Two references.}
"""


def test_each_configuration_against_each_reference_for_each_metric_in_one_family_holm_over_the_page(
    tmp_path, monkeypatch
):
    saved = saved_figures(monkeypatch)
    """Two references and two metrics, 5 seeds a side: one table, its p-values one family (a pair compared
    both ways counted once: 3 comparisons a metric, 6 in all), each row with the t-test and the exact
    sign-flip test, both adjusted by Holm over the 6."""
    import itertools

    from scipy import stats

    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "toy.yaml").write_text(TWO_REFERENCES)
    monkeypatch.setattr("capsexp.locations.CONFIG_DIR", tmp_path / "conf")
    accuracies = {
        ("arm=dynamic",): [0.97, 0.99, 0.98, 0.975, 0.985],
        ("arm=self",): [0.95, 0.96, 0.98, 0.93, 0.94],
        ("arm=uniform",): [0.96, 0.97, 0.97, 0.969, 0.968],
    }
    make_study(tmp_path / "sweep", accuracies)
    page = (compare(tmp_path / "sweep").output / "README.md").read_text()
    section = page[page.index("## Against `arm=uniform`, `arm=dynamic`") :]
    assert "The 6 p-values of each test in this table are one family, adjusted by Holm's method" in section
    assert "2 of the 8 tested rows compare a pair the other way round: the same test, counted once." in section
    rows = [line for line in section.splitlines() if line.startswith(("| test/acc |", "| val/acc |"))]
    assert [tuple(line.split(" | ")[:3]) for line in rows] == [
        (f"| {metric}", reference, arm)
        for metric in ("test/acc", "val/acc")
        for reference, arm in (
            ("arm=uniform", "arm=dynamic"),
            ("arm=uniform", "arm=self"),
            ("arm=dynamic", "arm=self"),
            ("arm=dynamic", "arm=uniform"),
        )
    ]

    def flips(differences):  # the sign-flip p by brute force over the 32 sign vectors
        observed = abs(sum(differences))
        sums = [
            abs(sum(s * d for s, d in zip(signs, differences, strict=True)))
            for signs in itertools.product((1, -1), repeat=5)
        ]
        return sum(total >= observed - 1e-12 for total in sums) / 32

    pairs = (("arm=dynamic", "arm=uniform"), ("arm=self", "arm=uniform"), ("arm=self", "arm=dynamic"))
    t_p = {pair: stats.ttest_rel(accuracies[(pair[0],)], accuracies[(pair[1],)]).pvalue for pair in pairs}
    flip_p = {
        pair: flips([a - r for a, r in zip(accuracies[(pair[0],)], accuracies[(pair[1],)], strict=True)])
        for pair in pairs
    }

    def holm(ps):  # the same 3 p-values once per metric: 6 in the family
        family = sorted([(p, pair, metric) for pair, p in ps.items() for metric in (0, 1)], key=lambda x: x[0])
        adjusted, running = {}, 0.0
        for rank, (p, pair, _) in enumerate(family):
            running = max(running, min(1.0, (6 - rank) * p))
            adjusted.setdefault(pair, running)
        return adjusted

    t_holm, flip_holm = holm(t_p), holm(flip_p)
    dynamic = rows[0].split(" | ")
    assert dynamic[3:5] == ["5 / 5", "+1.26"]  # +1, +2, +1, +0.6, +1.7 points
    assert dynamic[7:10] == [f"{t_holm[pairs[0]]:.3f}", f"{flip_holm[pairs[0]]:.3f}", "yes |"]  # 0.048
    other_way = rows[3].split(" | ")
    assert other_way[4] == "-1.26" and other_way[7:9] == dynamic[7:9]  # one comparison, one adjusted p
    self_row = rows[1].split(" | ")
    assert self_row[7:9] == [f"{t_holm[pairs[1]]:.3f}", f"{flip_holm[pairs[1]]:.3f}"]
    # The forest plot fills the dot of a significant difference only: dynamic - uniform (0.048), not self's.
    import matplotlib.colors

    axes = saved["differences.png"].axes[0]
    labels = [tick.get_text() for tick in axes.get_yticklabels()]
    dots = {round(line.get_ydata()[0]): line for line in axes.get_lines() if line.get_marker() == "o"}
    filled = {
        label: matplotlib.colors.to_hex(dots[len(labels) - 1 - i].get_markerfacecolor()) != "#ffffff"
        for i, label in enumerate(labels)
    }
    assert filled == {
        "arm=dynamic − arm=uniform": True,
        "arm=self − arm=uniform": False,
        "arm=self − arm=dynamic": False,
    }


def test_the_diagnostics_give_each_routing_layers_coupling_change_at_its_last_iteration(tmp_path):
    from capsexp.results.diagnostics import diagnostics_section
    from capsexp.results.runs import find_runs, group, label_configurations

    changes = {
        "0": ("arm=dynamic", {2: 0.002, 3: 0.0007}),
        "1": ("arm=em", {2: 0.05}),
        "2": ("arm=dynamic", {3: 0.0009}),
    }
    for name, (arm, by_iteration) in changes.items():
        (tmp_path / name / ".hydra").mkdir(parents=True)
        (tmp_path / name / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([arm, f"seed={name}"]))
        with SummaryWriter(str(tmp_path / name / "tensorboard")) as writer:
            writer.add_scalar("routing/digits/entropy", 0.9, 10)
            for iteration, change in by_iteration.items():
                writer.add_scalar(f"routing/digits/coupling_change_iter{iteration}", change, 10)
    runs = find_runs(tmp_path)
    label_configurations(runs)
    rows = {
        line.split(" | ")[0][2:]: line for line in diagnostics_section(group(runs)).splitlines() if "| arm=" in line
    }
    assert rows["arm=dynamic"].endswith("| 0.0008 (iteration 3) |")  # the mean of its runs' last iterations
    assert rows["arm=em"].endswith("| 0.05 (iteration 2) |")


def test_the_page_names_the_code_each_run_ran_and_keeps_its_config_without_paths(tmp_path):
    """Runs of two revisions: the page lists both and says they differ; kept runs hold each run's
    revision and its composed config with this machine's paths replaced."""
    from capsexp.records.revision import REVISION_FILE, write_revision
    from capsexp.results.kept_runs import MACHINE_PATH

    make_runs(tmp_path / "multirun")
    runs = sorted((tmp_path / "multirun").iterdir())
    clean = {"version": "0.1.0", "commit": "a" * 40, "dirty": False, "diff_sha256": None}
    changed = {**clean, "dirty": True, "diff_sha256": "b" * 64}
    for index, run in enumerate(runs):
        write_revision(run, changed if index == 0 else clean)
        (run / ".hydra" / "config.yaml").write_text(
            yaml.safe_dump(
                {"data": {"data_dir": "${paths.data_dir}"}, "paths": {"data_dir": "/home/me/data"}, "seed": 1}
            )
        )
    output = compare(tmp_path / "multirun", tmp_path / "out", keep=True).output
    code = next(line for line in (output / "README.md").read_text().splitlines() if line.startswith("- Code:"))
    assert code == (
        f"- Code: `aaaaaaa+changes bbbbbbbb` (1 run); `aaaaaaa` ({len(runs) - 1} runs); "
        "**the runs ran different code**."
    )
    kept = output / "runs" / runs[0].name
    assert yaml.safe_load((kept / REVISION_FILE).read_text()) == changed
    config = yaml.safe_load((kept / ".hydra" / "config.yaml").read_text())
    assert config == {"data": {"data_dir": "${paths.data_dir}"}, "paths": {"data_dir": MACHINE_PATH}, "seed": 1}
    for run in runs:  # one revision for all
        (run / REVISION_FILE).unlink()
        write_revision(run, clean)
    page = compare(tmp_path / "multirun", tmp_path / "again").output / "README.md"
    assert "- Code: `aaaaaaa` (every run)." in page.read_text()


def test_the_page_says_what_precision_its_runs_trained_in_where_they_recorded_it(tmp_path, monkeypatch):
    """trainer.precision=auto chooses per net and machine: the runs' records give the page's precision line,
    with each precision's count; runs from before the record was kept give none."""

    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "toy.yaml").write_text(EXPERIMENT)
    monkeypatch.setattr("capsexp.locations.CONFIG_DIR", tmp_path / "conf")
    accuracies = {
        ("iterations=1", "reconstruction=true"): [0.95, 0.96],
        ("iterations=3", "reconstruction=true"): [0.97],
    }
    make_study(tmp_path / "sweep", accuracies)
    assert "- Precision:" not in (compare(tmp_path / "sweep").output / "README.md").read_text()
    for job, precision in enumerate(["bf16-mixed", "32-true", "bf16-mixed"]):
        machine = tmp_path / "sweep" / str(job) / "machine.yaml"
        machine.write_text(machine.read_text() + f"precision: {precision}\n")
    page = (compare(tmp_path / "sweep").output / "README.md").read_text()
    assert "\n- Precision: bf16-mixed (2 runs), 32-true (1 run).\n" in page


HYPOTHESES = """
hydra: {sweeper: {params: {arm: 'a,b,c,d'}}}
page:
  title: Declared
  reference: arm=a
  notes:
    quick: >-
      b minus a: {{ difference('test/acc', 'arm=b', 'arm=a') }},
      Holm p {{ difference('test/acc', 'arm=b', 'arm=a').p_text }}.
  claims:
    quick:
      - {claim: b beats a, holds: "supported('b against a')"}
  hypotheses:
    - {name: b against a, metric: test/acc, arm: arm=b, reference: arm=a, smallest_effect: 0.5}
    - {name: c against a, metric: test/acc, arm: arm=c, reference: arm=a, smallest_effect: 0.5}
    - {name: c above a, metric: test/acc, arm: arm=c, reference: arm=a, smallest_effect: 0.5,
       direction: greater, test: permutation}
    - {name: d against a, metric: test/acc, arm: arm=d, reference: arm=a, smallest_effect: 0.5}
"""


def test_declared_hypotheses_are_the_pages_family_and_every_other_comparison_is_exploratory(tmp_path, monkeypatch):
    """Four hypotheses, one arm with 3 seeds: the 3 tested are adjusted together by Holm (each by its own
    test and direction); supported only where the adjusted p is below 0.05; the interval read against the
    smallest effect; the table of every arm against the reference gives intervals and no p-value."""
    import itertools

    from scipy import stats

    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "toy.yaml").write_text(HYPOTHESES)
    monkeypatch.setattr("capsexp.locations.CONFIG_DIR", tmp_path / "conf")
    a = [0.950, 0.955, 0.948, 0.952, 0.951]
    b = [0.970, 0.972, 0.969, 0.975, 0.970]  # about +2 points, every seed
    c = [0.950513, 0.954533, 0.948531, 0.952109, 0.950709]  # within 0.06 points of a, both signs
    make_study(tmp_path / "sweep", {("arm=a",): a, ("arm=b",): b, ("arm=c",): c, ("arm=d",): [0.96, 0.97, 0.95]})
    page = (compare(tmp_path / "sweep").output / "README.md").read_text()
    section = page[page.index("## Declared hypotheses") : page.index("## Against")]
    assert "The 3 tested are the page's one family of p-values" in section
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in section.splitlines() if line.startswith("| ")}
    import numpy as np

    logged = {name: np.float32(values).astype(np.float64) for name, values in (("a", a), ("b", b), ("c", c))}
    c_minus_a = logged["c"] - logged["a"]  # +0.05, -0.05, +0.05, +0.01, -0.03 points, none alike

    def flips(test):  # the share of the 32 sign flips whose statistic reaches the observed one
        signs = itertools.product((1, -1), repeat=5)
        return sum(test(np.dot(s, c_minus_a)) >= test(c_minus_a.sum()) - 1e-12 for s in signs) / 32

    t_ps = [
        stats.ttest_rel(logged["b"], logged["a"]).pvalue,
        stats.ttest_rel(logged["c"], logged["a"]).pvalue,
        stats.ttest_rel(logged["c"], logged["a"], alternative="greater").pvalue,
    ]
    flip_ps = [2 / 32, flips(abs), flips(lambda total: total)]

    def holm(ps):
        order = sorted(range(len(ps)), key=lambda i: ps[i])
        adjusted, running = [0.0] * len(ps), 0.0
        for rank, i in enumerate(order):
            running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
            adjusted[i] = running
        return adjusted

    t_holm, flip_holm = holm(t_ps), holm(flip_ps)
    columns = {name: row[9:11] for name, row in rows.items() if name != "hypothesis"}
    assert columns["b against a"] == ["< 0.001" if t_holm[0] < 0.001 else f"{t_holm[0]:.3f}", f"{flip_holm[0]:.3f}"]
    assert columns["c against a"] == [f"{t_holm[1]:.3f}", f"{flip_holm[1]:.3f}"]
    assert columns["c above a"] == [f"{t_holm[2]:.3f}", f"{flip_holm[2]:.3f}"]
    assert rows["c above a"][3] == "greater" and rows["c above a"][11] == "permutation"
    assert rows["b against a"][-1].startswith("**supported**: the arm is above its reference (on the t-test alone")
    said = "cannot tell at this power: no difference found, and no margin declared to test for none; detectable"
    assert rows["c against a"][-1].startswith(said) and rows["c above a"][-1].startswith(said)
    assert rows["d against a"][-1].startswith("too few seeds to test")
    table = page[page.index("## Against") :]
    assert "Exploratory: differences and intervals, no tests" in table and "Holm" not in table.split("\n\n")[2]
    assert (
        "b minus a: +2.00, Holm p < 0.001." in page
    )  # the notes quote the family's p-value  # the notes quote the family's p-value


def test_a_malformed_hypothesis_is_a_config_error_naming_what_is_allowed(tmp_path, monkeypatch):
    from capsexp.results import study

    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    monkeypatch.setattr("capsexp.locations.CONFIG_DIR", tmp_path / "conf")
    for change, message in (
        ("smallest_effect: 0.5}", "smallest_effect: 0.5, direction: up}"),
        ("smallest_effect: 0.5}", "smallest_effect: 0.5, tests: t}"),
    ):
        (tmp_path / "conf" / "experiment" / "toy.yaml").write_text(HYPOTHESES.replace(change, message, 1))
        with pytest.raises(ConfigError, match=r"toy\.yaml: its page is malformed") as error:
            study.load_study_page("toy", "quick")
        assert "two-sided, greater, less" in str(error.value) or "it has name, metric" in str(error.value)


def test_a_hypothesis_is_judged_by_the_p_value_of_the_test_it_declares():
    """test: permutation -> the permutation test's p-value is the one the family adjusts; t (the default),
    or an exploratory comparison, the t-test's."""
    from capsexp.results.differences import Compared
    from capsexp.results.statistics import Difference
    from capsexp.results.study import Hypothesis

    difference = Difference(2.0, "paired t", 1.0, 3.0, p=0.001, p_permutation=0.0625, runs=(5, 5))

    def compared(test: str | None) -> Compared:
        hypothesis = None if test is None else Hypothesis("b against a", "test/acc", "arm=b", "arm=a", 0.5, test=test)
        return Compared("test/acc", None, None, difference, None, hypothesis)

    assert [compared(test).p for test in ("permutation", "t", None)] == [0.0625, 0.001, 0.001]
