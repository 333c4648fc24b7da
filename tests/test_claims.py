"""Results pages as evidence: every committed page rebuilds byte-identical from its kept runs, the
figures its prose quotes come from those runs, and a claim the runs stop supporting fails the rebuild."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from torch.utils.tensorboard import SummaryWriter

from capsexp.errors import ConfigError
from capsexp.records.events import event_files, load_events
from capsexp.results.claims import ClaimError, reflow
from capsexp.results.compare import compare
from capsexp.testing import assert_page_rebuilds
from tests.helpers import EXAMPLE, PROJECT_ROOT, example_routings

RESULTS = PROJECT_ROOT / "experiments" / "results"
# The pages ``capsexp.compare`` writes (each has its comparison table); a page a script writes from its own kept
# runs (run_overhead) has that script's rebuild test beside the script's other tests.
PAGES = sorted(path.parent.name for path in RESULTS.glob("*/comparison.csv"))


@pytest.mark.slow
@pytest.mark.parametrize("name", PAGES)
def test_every_committed_page_rebuilds_byte_identical_from_its_runs(name, tmp_path):
    """Each page of experiments/results/ as a reader would check it: its README, table and figures
    written again from the runs kept beside them, in a copy of the folder."""
    from capsexp.config.routing_registry import registered

    judged = {run.name.rpartition("=")[2].partition("-")[0] for run in (RESULTS / name / "runs").iterdir()}
    if missing := judged & example_routings() - set(registered()):
        # A page judging the example's routing reads its options (make examples installs it, as CI does first).
        pytest.skip(f"judges {', '.join(sorted(missing))}: needs {EXAMPLE.relative_to(PROJECT_ROOT)} installed")
    assert_page_rebuilds(RESULTS / name, tmp_path)


def rewrite_scalar(run: Path, tag: str, value: float) -> None:
    """Set the last value of ``tag`` in a run's event files to ``value``, keeping every other event."""
    events = load_events(run)
    scalars = {t: events.Scalars(t) for t in events.Tags()["scalars"]}
    folder = event_files(run)[0].parent
    for path in event_files(run):
        path.unlink()
    with SummaryWriter(str(folder)) as writer:
        for t, series in scalars.items():
            for i, event in enumerate(series):
                changed = value if t == tag and i == len(series) - 1 else event.value
                writer.add_scalar(t, changed, event.step, walltime=event.wall_time)


@pytest.mark.slow
def test_a_run_changed_so_that_a_claim_no_longer_holds_fails_the_rebuild_naming_the_claim(tmp_path):
    """The routing page claims self-routing's presence gap is about 0. One of its five runs given a gap
    of 0.9: the rebuild writes the page with the claim marked and fails, naming it."""
    shutil.copytree(RESULTS / "routing_comparison_quick" / "runs", tmp_path / "runs")
    self_run = next(
        path.parent.parent
        for path in sorted((tmp_path / "runs").rglob("overrides.yaml"))
        if "+arm/routing=self" in yaml.safe_load(path.read_text())
    )
    rewrite_scalar(self_run, "val/presence_gap", 0.9)
    with pytest.raises(ClaimError, match="'Self-routing falls far behind, with a presence gap of about 0'") as error:
        compare(tmp_path / "runs", tmp_path)
    assert "routing_comparison.yaml" in str(error.value) and error.value.exit_code == 1
    page = (tmp_path / "README.md").read_text()
    assert "**These runs do not support the notes' claims:** \"Self-routing falls far behind" in page
    # The notes quote the changed figure: the mean of the five gaps, one of them now 0.9.
    assert "a presence gap of\n  0.18 ± 0.40" in page


def test_notes_quote_the_runs_figures_and_runs_made_otherwise_get_a_line_instead(tmp_path, monkeypatch):
    from tests.test_compare import make_study

    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "toy.yaml").write_text(
        "hydra: {sweeper: {params: {arm: 'a,b'}}}\n"
        "page:\n"
        "  notes:\n"
        "    quick: |\n"
        "      b leads a by {{ difference('test/acc', 'arm=b', 'arm=a') }} points\n"
        "      ({{ summary('test/acc', 'arm=b') }}%), 95% interval\n"
        "      {{ difference('test/acc', 'arm=b', 'arm=a').interval }}.\n"
        "  claims:\n"
        "    quick:\n"
        "      - {claim: b leads a, holds: \"difference('test/acc', 'arm=b', 'arm=a').points > 0\"}\n"
    )
    monkeypatch.setattr("capsexp.locations.CONFIG_DIR", tmp_path / "conf")
    make_study(tmp_path / "sweep", {("arm=a",): [0.90, 0.92], ("arm=b",): [0.95, 0.96]})
    page = (compare(tmp_path / "sweep").output / "README.md").read_text()
    # Differences +5 and +4 points: mean 4.5, standard error 0.5 on 1 degree of freedom (t 12.706).
    assert "b leads a by +4.50 points (95.50 ± 0.71%), 95% interval [-1.85, +10.85].\n" in page
    # A p-value of a comparison the page does not test (2 seeds a side) is the notes' mistake: an error.
    experiment = tmp_path / "conf" / "experiment" / "toy.yaml"
    experiment.write_text(experiment.read_text().replace(".interval }}", ".p_text }}"))
    with pytest.raises(ConfigError, match=r"toy.yaml: the page's notes do not render \(the notes print the p-value"):
        compare(tmp_path / "sweep")
    # A user's shortened run of the study: the notes describe the study's own runs, so they are left out.
    make_study(tmp_path / "short", {("arm=a", "trainer.max_steps=20"): [0.5], ("arm=b", "trainer.max_steps=20"): [0.4]})
    page = (compare(tmp_path / "short").output / "README.md").read_text()
    assert "b leads a" not in page
    assert "These runs were made with other settings than the study's (`trainer.max_steps=20`)" in page


def test_a_claim_that_does_not_evaluate_is_a_config_error_naming_it(tmp_path, monkeypatch):
    from tests.test_compare import make_study

    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "toy.yaml").write_text(
        "page:\n  notes: {quick: Notes.}\n  claims:\n    quick:\n      - {claim: broken, holds: \"nosuch('x')\"}\n"
    )
    monkeypatch.setattr("capsexp.locations.CONFIG_DIR", tmp_path / "conf")
    make_study(tmp_path / "sweep", {(): [0.9]})
    with pytest.raises(ConfigError, match=r"toy.yaml: claim 'broken': its expression does not evaluate"):
        compare(tmp_path / "sweep")


def test_rendered_notes_are_wrapped_again_keeping_a_figure_with_its_spread():
    text = "- a " + "word " * 30 + "95.50 ± 0.71% end\nnext line\n\nparagraph"
    lines = reflow(text).split("\n")
    assert all(len(line) <= 100 for line in lines)
    assert lines[1].startswith("  ") and any("95.50 ± 0.71%" in line for line in lines)
    assert lines[-2:] == ["", "paragraph"]


def test_a_page_of_two_launches_names_each_command_and_keeps_them(tmp_path):
    """Runs from two multiruns under one folder: the header lists each launch's command with its runs,
    and the kept copy keeps both commands and the page's order of the runs."""
    from tests.test_compare import make_study

    for launch, arm in (("first", "model=lenet5"), ("second", "model=capsnet")):
        make_study(tmp_path / "logs" / launch, {(arm,): [0.9, 0.92]})
        multirun = {"hydra": {"overrides": {"task": ["experiment=toy", "study=quick", arm]}}}
        (tmp_path / "logs" / launch / "multirun.yaml").write_text(yaml.safe_dump(multirun))
    compare(tmp_path / "logs", tmp_path / "page", keep=True)
    page = (tmp_path / "page" / "README.md").read_text()
    assert (
        "- Commands, 2 launches:\n"
        "  - `python -m capsexp -m experiment=toy study=quick model=lenet5`: 2 runs, in `runs/first/`\n"
        "  - `python -m capsexp -m experiment=toy study=quick model=capsnet`: 2 runs, in `runs/second/`\n"
    ) in page
    kept = tmp_path / "page" / "runs"
    assert yaml.safe_load((kept / "second" / "command.yaml").read_text())[-1] == "model=capsnet"
    assert yaml.safe_load((kept / "order.yaml").read_text()) == ["first/0", "first/1", "second/0", "second/1"]


def test_a_figure_written_into_the_notes_by_hand_fails_the_rebuild_naming_it(tmp_path, monkeypatch):
    """A figure of the runs typed into the notes would not follow them: the rebuild refuses it. A paper's
    figure, and a setting quoted through ``setting()``, are not the runs'."""
    from tests.test_compare import make_study

    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    experiment = tmp_path / "conf" / "experiment" / "toy.yaml"
    notes = (
        "b leads a by 4.50 points. The paper reports 99.3% for b. Both stop at "
        "{{ '%g' | format(100 * setting('budgets.quick.threshold')) }}%."
    )
    experiment.write_text(
        yaml.safe_dump(
            {
                "budgets": {"quick": {"threshold": 0.975}},
                "hydra": {"sweeper": {"params": {"arm": "a,b"}}},
                "page": {"notes": {"quick": notes}},
            }
        )
    )
    monkeypatch.setattr("capsexp.locations.CONFIG_DIR", tmp_path / "conf")
    make_study(tmp_path / "sweep", {("arm=a",): [0.90, 0.92], ("arm=b",): [0.95, 0.96]})
    with pytest.raises(ConfigError, match=r"toy\.yaml: the notes give '4\.50 points' by hand"):
        compare(tmp_path / "sweep")
    experiment.write_text(
        experiment.read_text().replace("4.50 points", "{{ difference('test/acc', 'arm=b', 'arm=a') }} points")
    )
    page = (compare(tmp_path / "sweep").output / "README.md").read_text()
    assert "b leads a by +4.50 points. The paper reports 99.3% for b. Both stop at 97.5%." in page
