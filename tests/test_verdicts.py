"""Verdicts a reviewer accepts: the seeds a comparison needs planned from a pilot's paired spread, and each
declared hypothesis with a margin read as supported, equivalent within the margin, or cannot tell."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from capsexp.records.events import Scalar
from capsexp.results.differences import family, verdict
from capsexp.results.runs import Run, group, label_configurations
from capsexp.results.statistics import pilot_std_bound, seeds_needed
from capsexp.results.study import Hypothesis, StudyPage


def t_power(delta: float, std: float, n: int, level: float) -> float:
    """The two-sided paired t-test's power, from the noncentral t (written out here, not capsexp's)."""
    critical = stats.t.ppf(1 - level / 2, n - 1)
    shift = delta / (std / math.sqrt(n))
    return stats.nct.sf(critical, n - 1, shift) + stats.nct.cdf(-critical, n - 1, shift)


@pytest.mark.parametrize("std,effect,tests", [(1.6, 0.5, 1), (1.6, 1.9, 1), (0.4, 0.5, 8), (2.0, 1.0, 44)])
def test_the_seeds_for_power_are_the_fewest_at_which_the_t_test_reaches_it(std, effect, tests):
    plan = seeds_needed(std, effect, tests)
    level = 0.05 / tests
    assert t_power(effect, std, plan.for_power, level) >= 0.8 > t_power(effect, std, plan.for_power - 1, level)
    # The exact sign-flip test's smallest two-sided p, 2 / 2^n, reaches Holm's strictest level; one seed fewer does not.
    assert 2 / 2**plan.for_permutation <= level < 2 / 2 ** (plan.for_permutation - 1)
    assert plan.seeds == max(plan.for_power, plan.for_permutation) and plan.level == pytest.approx(level)


def test_five_seeds_cannot_reach_holms_level_over_eight_hypotheses_and_nine_can():
    assert seeds_needed(0.1, 1.0, tests=8).for_permutation == 9  # 2/2^9 = 0.0039 <= 0.05/8 < 2/2^8
    assert seeds_needed(1.6, 0.5, 1).for_power in range(80, 86)  # about 80 seeds for half a point at 1.6


def test_the_seeds_planned_for_equivalence_show_it_in_about_the_planned_share_of_simulated_studies():
    std, margin, tests = 1.0, 0.8, 2
    plan = seeds_needed(std, margin, tests, margin=margin)
    level = 0.05 / tests
    rng = np.random.default_rng(0)
    differences = rng.normal(0.0, std, size=(20000, plan.for_equivalence))  # no true difference
    mean, error = differences.mean(axis=1), differences.std(axis=1, ddof=1) / math.sqrt(plan.for_equivalence)
    critical = stats.t.ppf(1 - level, plan.for_equivalence - 1)
    shown = (mean - critical * error > -margin) & (mean + critical * error < margin)  # both one-sided tests
    assert 0.75 <= shown.mean() < 0.9
    fewer = differences[:, : plan.for_equivalence - 3]
    mean, error = fewer.mean(axis=1), fewer.std(axis=1, ddof=1) / math.sqrt(fewer.shape[1])
    critical = stats.t.ppf(1 - level, fewer.shape[1] - 1)
    assert ((mean - critical * error > -margin) & (mean + critical * error < margin)).mean() < 0.8


def test_a_pilots_spread_is_planned_at_its_upper_bound_which_covers_the_true_spread_as_often_as_it_says():
    assert pilot_std_bound(1.0, 3) == pytest.approx(math.sqrt(2 / 0.4462871026284195))  # chi2(2)'s 20% point
    rng = np.random.default_rng(1)
    pilots = rng.normal(0.0, 2.0, size=(20000, 4))  # true spread 2, pilots of 4 seeds
    bounds = np.array([pilot_std_bound(s, 4) for s in pilots.std(axis=1, ddof=1)])
    assert 0.78 < (bounds >= 2.0).mean() < 0.82
    with pytest.raises(ValueError, match="two runs at least"):
        pilot_std_bound(1.0, 1)


def runs_of(arm: str, values: list[float]) -> list[Run]:
    return [
        Run(Path(f"{arm}-{seed}"), [f"+arm/v={arm}", f"seed={seed}"], {"test/acc": [Scalar(600, value)]})
        for seed, value in enumerate(values, start=1)
    ]


def test_a_hypothesis_with_a_margin_is_supported_equivalent_or_cannot_tell_by_its_runs(tmp_path, monkeypatch):
    rng = np.random.default_rng(4)
    base = 0.95 + rng.normal(0, 0.004, 10)
    runs = [
        *runs_of("reference", list(base)),
        *runs_of("better", list(base + 0.01 + rng.normal(0, 0.0005, 10))),  # one point above, every seed
        *runs_of("same", list(base + rng.normal(0, 0.0005, 10))),  # within 0.05 points
        *runs_of("noisy", list(base + rng.normal(0, 0.03, 10))),  # three points either way
    ]
    label_configurations(runs)
    declared = tuple(
        Hypothesis(arm, "test/acc", f"+arm/v={arm}", "+arm/v=reference", 0.5, test="permutation", margin=0.5)
        for arm in ("better", "same", "noisy")
    )
    page = StudyPage(metrics=("test/acc",), references=("+arm/v=reference",), hypotheses=declared)
    rows = {row.hypothesis.name: row for row in family(group(runs), ["test/acc"], page) if row.hypothesis}
    said = {name: verdict(row, row.p_holm) for name, row in rows.items()}
    assert said["better"].startswith("**supported**: the arm is above its reference")
    assert said["same"].startswith("**equivalent** within ±0.5")
    assert said["noisy"].startswith("cannot tell at this power")
    # Holm over the three margins: the smallest two-one-sided p is multiplied by 3 at most.
    same = rows["same"]
    assert same.p_equivalence_holm == pytest.approx(min(1.0, 3 * same.equivalence.p))
    same_runs = [r.final("test/acc") for r in runs if "same" in r.overrides[0]]
    paired = [b - a for a, b in zip(base, same_runs, strict=True)]
    assert same.equivalence.mean == pytest.approx(np.mean(paired)) and same.equivalence.margin == 0.005
    # The forest plot tells the three apart: a filled dot, a green square, an open dot.
    import matplotlib.colors
    import matplotlib.figure

    from capsexp.results.compare import differences_figure

    drawn = {}
    save = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(
        matplotlib.figure.Figure,
        "savefig",
        lambda self, path, **kw: (drawn.update(axes=self.axes[0]), save(self, path, **kw)),
    )
    differences_figure(list(rows.values()), page, tmp_path)
    labels = [tick.get_text().split(" −")[0] for tick in drawn["axes"].get_yticklabels()][::-1]  # by position
    marked = {
        labels[round(line.get_ydata()[0])]: (line.get_marker(), matplotlib.colors.to_hex(line.get_markerfacecolor()))
        for line in drawn["axes"].get_lines()
        if line.get_marker() in ("o", "s")
    }
    assert marked == {"better": ("o", "#1f77b4"), "same": ("s", "#2ca02c"), "noisy": ("o", "#ffffff")}
    assert "a green square: equivalent within its margin" in drawn["axes"].figure._suptitle.get_text()


def test_hypotheses_in_families_are_adjusted_within_their_family_alone():
    rng = np.random.default_rng(7)
    base = 0.95 + rng.normal(0, 0.004, 10)
    shifts = {"a1": 0.004, "a2": 0.002, "b1": 0.003, "b2": 0.0, "b3": 0.001}
    runs = [*runs_of("reference", list(base))]
    for arm, shift in shifts.items():
        runs += runs_of(arm, list(base + shift + rng.normal(0, 0.002, 10)))
    label_configurations(runs)
    declared = tuple(
        Hypothesis(arm, "test/acc", f"+arm/v={arm}", "+arm/v=reference", 0.5, margin=0.5, family=arm[0])
        for arm in shifts
    )
    page = StudyPage(metrics=("test/acc",), references=("+arm/v=reference",), hypotheses=declared)
    rows = [row for row in family(group(runs), ["test/acc"], page) if row.hypothesis]
    for members in (rows[:2], rows[2:]):  # family a: 2 p-values, family b: 3, Holm written out for each
        p = [row.difference.p for row in members]
        order = sorted(range(len(p)), key=p.__getitem__)
        expected, running = [0.0] * len(p), 0.0
        for rank, index in enumerate(order):
            running = max(running, min(1.0, (len(p) - rank) * p[index]))
            expected[index] = running
        assert [row.p_holm for row in members] == pytest.approx(expected)
        tost = [row.equivalence.p for row in members]
        assert min(row.p_equivalence_holm for row in members) == pytest.approx(min(1.0, len(p) * min(tost)))


BUILT_IN_JUDGED = ["attention", "dynamic", "efficient", "em", "em_paper", "self", "sinkhorn", "vb"]


def test_the_reference_asks_each_routing_the_verdicts_hypotheses_of_its_own_cells():
    from omegaconf import OmegaConf

    from capsexp.results.study import load_study_page
    from tests.helpers import PROJECT_ROOT

    verdict = load_study_page("routing_verdict", "quick").hypotheses
    # capsexp's own routings (the example package's max_min is judged by its own tests, where it is installed)
    judged = f"page.verdicts.routings=[{','.join(BUILT_IN_JUDGED)}]"
    reference = load_study_page("routing_reference", "quick", overrides=[judged]).hypotheses
    em = [h for h in reference if h.family == "em"]
    assert [h.name for h in em] == [f"em: {h.name}" for h in verdict]
    assert [(h.metric, h.margin, h.smallest_effect, h.test) for h in em] == [
        (h.metric, h.margin, h.smallest_effect, h.test) for h in verdict
    ]
    assert {h.arm for h in em} == {"+arm/routing_verdict=em-routing"}
    assert [h.reference for h in em] == [
        "+arm/routing_verdict=em-shuffled", "+arm/routing_verdict=em-shuffled",
        "+arm/routing_verdict=uniform", "+arm/routing_verdict=uniform",
    ]  # fmt: skip
    assert [h.family for h in reference[::4]] == BUILT_IN_JUDGED
    config = OmegaConf.load(PROJECT_ROOT / "conf" / "experiment" / "routing_reference.yaml")
    assert list(config.page.verdicts.routings) == [*BUILT_IN_JUDGED, "max_min"]


@pytest.mark.parametrize(
    ("routing", "routes_judged"),
    [("dynamic", True), ("sinkhorn", True), ("em", False), ("em_paper", False), ("attention", False), ("vb", False)],
)
def test_it_routes_is_judged_only_where_the_shuffled_arm_changes_the_couplings_alone(routing, routes_judged):
    """Against the shuffled arm, whose parents are Eq. 1's, a routing that makes its own otherwise differs in
    that step too; "it helps" (against uniform coupling, the whole layer's procedure) is judged for every one."""
    from capsexp.results.study import load_study_page

    page = load_study_page("routing_reference", "quick", overrides=[f"page.verdicts.routings=[{routing}]"])
    reasons = {h.name: h.not_judged for h in page.hypotheses}
    routes = [name for name in reasons if "it routes" in name]
    helps = [name for name in reasons if "it helps" in name]
    assert len(routes) == 2 and len(helps) == 2
    assert all((reasons[name] == "") == routes_judged for name in routes)
    assert all("shuffled arm makes them as Eq. 1 does" in reasons[name] for name in routes if not routes_judged)
    assert all(reasons[name] == "" for name in helps)


def test_a_reference_naming_a_routing_not_installed_says_which_and_what_is():
    from capsexp.errors import ConfigError
    from capsexp.results.study import load_study_page

    said = r"routing_reference.yaml, page.verdicts.routings: mean_agreement: no such routing; one of: attention,"
    with pytest.raises(ConfigError, match=said):
        load_study_page("routing_reference", "quick", overrides=["page.verdicts.routings=[dynamic,mean_agreement]"])


def test_one_routings_verdict_page_judges_it_routes_by_the_routing_its_runs_name(tmp_path):
    from capsexp.results.study import page_for

    def runs(routing: str) -> list[Run]:
        return [
            Run(tmp_path / f"{routing}{seed}", ["experiment=routing_verdict", "study=quick", f"+routing={routing}",
                                                "+arm/routing_verdict=routing", f"seed={seed}"])
            for seed in (1, 2)
        ]  # fmt: skip

    for routing, judged in (("dynamic", True), ("self", False)):
        hypotheses = page_for(runs(routing)).hypotheses
        routes = [h.not_judged for h in hypotheses if h.name.startswith("it routes")]
        assert len(routes) == 2 and all((reason == "") == judged for reason in routes), routing
        assert all(h.not_judged == "" for h in hypotheses if h.name.startswith("it helps"))


def configured_runs(folder: Path, arm: str, accuracies: list[float], classes: int = 10) -> list[Run]:
    """Runs of ``arm`` whose composed config (as Hydra saves it) names ``classes``, with these best validation
    accuracies and a test accuracy a point above."""
    runs = []
    for seed, accuracy in enumerate(accuracies, start=1):
        run_folder = folder / f"{arm}-{seed}"
        (run_folder / ".hydra").mkdir(parents=True)
        (run_folder / ".hydra" / "config.yaml").write_text(f"geometry:\n  name: digits\n  num_classes: {classes}\n")
        scalars = {"val/acc_best": [Scalar(600, accuracy)], "test/acc": [Scalar(600, accuracy + 0.01)]}
        runs.append(Run(run_folder, [f"+arm/v={arm}", f"seed={seed}"], scalars))
    return runs


@pytest.mark.parametrize(("classes", "judged"), [(10, False), (100, True)])
def test_a_hypothesis_of_an_arm_that_did_not_learn_is_not_judged_whatever_its_test_gives(tmp_path, classes, judged):
    """17% accuracy: of 10 classes (below twice chance) a net that did not learn; of 100, one that did,
    and is judged (below its reference at every seed)."""
    from capsexp.studies.verdict import verdict_grid

    rng = np.random.default_rng(3)
    low = list(0.17 + rng.normal(0, 0.004, 10))
    base = list(0.95 + rng.normal(0, 0.004, 10))
    runs = [*configured_runs(tmp_path, "uniform", base, classes), *configured_runs(tmp_path, "a-routing", low, classes)]
    label_configurations(runs)
    declared = (Hypothesis("a: it helps", "test/acc", "+arm/v=a-routing", "+arm/v=uniform", 0.5, "two-sided",
                           "permutation", 0.5, family="a"),)  # fmt: skip
    page = StudyPage(metrics=("test/acc",), hypotheses=declared)
    (row,) = [row for row in family(group(runs), ["test/acc"], page) if row.hypothesis]
    said = verdict(row, row.p_holm)
    grid = verdict_grid(runs, page, tmp_path)
    if judged:
        assert said.startswith("**supported**: the arm is below its reference") and "| a | **supported**" in grid
    else:
        mean = 100 * np.mean(low)
        assert (
            said
            == f"not judged: +arm/v=a-routing did not learn (val/acc_best {mean:.1f}% over its 10 runs, chance 10%)"
        )
        assert "| a | not judged |" in grid
        assert f"- a (it helps): +arm/v=a-routing did not learn (val/acc_best {mean:.1f}%" in grid


def test_a_page_of_several_families_says_how_many_and_their_size():
    from capsexp.results.prose import hypotheses_intro

    said = hypotheses_intro(4, StudyPage(experiment="routing_reference"), 9)
    assert "They form 9 families, one per routing, of up to 4 tested p-values each" in said
    assert "one family" not in said
    assert "The 4 tested are the page's one family" in hypotheses_intro(4, StudyPage(experiment="routing_verdict"))


def test_the_verdict_grid_gives_each_routing_a_row_and_each_question_its_verdict_and_difference():
    from capsexp.studies.verdict import verdict_grid

    rng = np.random.default_rng(11)
    base = 0.95 + rng.normal(0, 0.004, 10)
    runs = [
        *runs_of("uniform", list(base)),
        *runs_of("a-routing", list(base + 0.01 + rng.normal(0, 0.0005, 10))),  # a point above, every seed
        *runs_of("b-routing", list(base + 0.0002 * np.array([1, -1, -1, 1, 1, -1, 1, -1, -1, 1]))),  # the same
    ]
    label_configurations(runs)
    declared = tuple(
        Hypothesis(f"{r}: it helps", "test/acc", f"+arm/v={r}-routing", "+arm/v=uniform", 0.5, "two-sided",
                   "permutation", 0.5, family=r)
        for r in ("a", "b")
    )  # fmt: skip
    page = StudyPage(metrics=("test/acc",), hypotheses=declared)
    grid = verdict_grid(runs, page, Path("."))
    lines = [line for line in grid.splitlines() if line.startswith("| ")]
    assert lines[0] == "| routing | it helps |"
    a_diff = 100 * np.mean([r.final("test/acc") for r in runs[10:20]]) - 100 * np.mean(base)
    assert lines[2] == f"| a | **supported**, above ({a_diff:+.2f}) |"
    assert lines[3].startswith("| b | **equivalent** within ±0.5 (")


def test_the_routing_measures_table_gives_each_configuration_its_measures_mean_and_std():
    from capsexp.studies.verdict import routing_measures

    def run(arm: str, seed: int, dependence: float, error: float) -> Run:
        scalars = {
            "routing/digits/test_image_dependence": [Scalar(9, dependence)],
            "equivariance/shift_2px/error": [Scalar(9, error)],
            "test/acc": [Scalar(9, 0.9)],
        }
        return Run(Path(f"{arm}-{seed}"), [f"+arm/v={arm}", f"seed={seed}"], scalars)

    runs = [run("em", 1, 0.7, 0.2), run("em", 2, 0.8, 0.3), run("em", 3, 0.9, 0.7), run("uniform", 1, 0.0, 0.5)]
    label_configurations(runs)
    table = [line for line in routing_measures(runs, StudyPage(), Path(".")).splitlines() if line.startswith("| ")]
    assert table[0] == "| configuration | runs | image dependence, digits | equivariance error, shift_2px |"
    assert table[2] == f"| em | 3 | 0.800 ± 0.100 | 0.400 ± {np.std([0.2, 0.3, 0.7], ddof=1):.3f} |"
    assert table[3] == "| uniform | 1 | 0.000 | 0.500 |"


def test_a_reference_keeps_the_verdicts_of_routings_it_answered_and_a_card_quotes_its_routings(tmp_path, monkeypatch):
    from capsexp.records import verdicts
    from capsexp.records.model_card import CardFacts, model_card
    from capsexp.studies.verdict import verdict_grid

    rng = np.random.default_rng(11)
    base = 0.95 + rng.normal(0, 0.004, 10)
    runs = [*runs_of("uniform", list(base)), *runs_of("a-routing", list(base + 0.01 + rng.normal(0, 0.0005, 10)))]
    runs += runs_of("b-routing", list(base[:2]))  # two seeds: too few to test, so b is not kept
    label_configurations(runs)
    declared = tuple(
        Hypothesis(f"{r}: it helps", "test/acc", f"+arm/v={r}-routing", "+arm/v=uniform", 0.5, margin=0.5, family=r)
        for r in ("a", "b")
    )
    page = StudyPage(metrics=("test/acc",), hypotheses=declared, verdicts_setting="in a test's net, 10 seeds")
    folder = tmp_path / "experiments" / "results" / "routing_reference_quick"
    folder.mkdir(parents=True)
    monkeypatch.setattr("capsexp.locations.CHECKOUT", tmp_path)
    monkeypatch.setattr(verdicts, "CHECKOUT", tmp_path)
    verdict_grid(runs, page, folder)
    kept = json.loads((folder / "verdicts.json").read_text())
    a_diff = 100 * np.mean([r.final("test/acc") for r in runs[10:20]]) - 100 * np.mean(base)
    assert kept == {
        "page": "experiments/results/routing_reference_quick",
        "setting": "in a test's net, 10 seeds",
        "verdicts": {"a": {"it helps": f"supported, above ({a_diff:+.2f})"}},
    }
    assert verdicts.verdict_of("b") == [] and verdicts.verdict_of("a")[0]["answers"] == kept["verdicts"]["a"]
    facts = CardFacts(
        net="CapsNet", choices={"model": "capsnet", "data": "mnist"}, config={}, parameters=1, flops=1.0,
        split_sizes={}, class_names=[], metrics={}, train_seconds=None, revision=None,
        machine={"cpu": "AMD EPYC", "cores": 2, "torch": "2.14.1"},
        checkpoint=None, run_folder="logs/x", routing="a", verdicts=verdicts.verdict_of("a"),
    )  # fmt: skip
    card = model_card(facts)
    section = card[card.index("## Its routing's verdict") : card.index("## Provenance")]
    assert "`model/routing=a` in a test's net, 10 seeds (`experiments/results/routing_reference_quick/`):" in section
    assert f"- it helps: supported, above ({a_diff:+.2f})" in section
    assert "## Its routing's verdict" not in model_card(replace(facts, routing="b", verdicts=()))


@pytest.mark.parametrize(
    "net,quoted",
    [({"routing": {}, "head": "capsules"}, "em"), ({"routing": {}, "head": "fully_connected"}, None), ({}, None)],
)
def test_a_card_quotes_the_routing_its_net_routes_with_and_none_for_a_head_or_net_without(net, quoted, monkeypatch):
    from types import SimpleNamespace

    from hydra.core.hydra_config import HydraConfig

    from capsexp.run.card import chosen_routing

    monkeypatch.setattr(HydraConfig, "initialized", staticmethod(lambda: True))
    choices = SimpleNamespace(runtime=SimpleNamespace(choices={"model/routing": "em"}))
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: choices))
    assert chosen_routing({"model": {"net": net}}) == quoted


CLEAN = {"commit": "a" * 40, "dirty": False}
MACHINE = {"cpu": "AMD EPYC", "cores": 2, "gpus": [], "torch": "2.14.1"}


@pytest.mark.parametrize(
    "records,reason",
    [
        ([(CLEAN, MACHINE)] * 3, None),
        ([(None, None)] * 3, None),  # from before runs kept records: read as they were
        ([(CLEAN, MACHINE), (CLEAN, MACHINE), ({"commit": "b" * 40}, MACHINE)], "its runs ran 2 versions of the code"),
        (
            [(CLEAN, MACHINE), ({"commit": "a" * 40, "dirty": True, "diff_sha256": "c" * 64}, MACHINE)],
            "its runs ran 2 versions of the code, some uncommitted",
        ),
        ([(CLEAN, MACHINE), (None, MACHINE), (None, MACHINE)], "2 of its 3 runs keep no record of their code"),
        (
            [(CLEAN, MACHINE), (CLEAN, {**MACHINE, "cpu": "Intel Xeon"}), (CLEAN, None)],
            "its runs ran on 2 machines, and 1 of its 3 runs keeps no record of their machine",
        ),
    ],
    ids=["one commit, one machine", "no records", "two commits", "uncommitted", "code unrecorded", "machines"],
)
def test_runs_that_mix_code_or_machines_are_named_as_such(records, reason):
    from capsexp.results.runs import mixed_provenance

    runs = [
        Run(Path(str(index)), [f"seed={index}"], revision=revision, machine=machine)
        for index, (revision, machine) in enumerate(records)
    ]
    assert mixed_provenance(runs) == reason


def test_a_page_whose_runs_mix_revisions_reads_its_hypotheses_as_exploratory_and_keeps_no_verdict(tmp_path):
    """The reference's own page, its runs at two commits: the grid says exploratory, verdicts.json is not
    written, and a page at one commit is read confirmatory."""
    from capsexp.results.study import page_for
    from capsexp.studies.verdict import verdict_grid

    rng = np.random.default_rng(11)
    base = 0.95 + rng.normal(0, 0.004, 10)
    cells = [*runs_of("uniform", list(base)), *runs_of("dynamic-routing", list(base + 0.01 + rng.normal(0, 5e-4, 10)))]
    for index, run in enumerate(cells):
        run.overrides += ["experiment=routing_reference", "study=quick", "page.verdicts.routings=[dynamic]"]
        run.overrides[0] = run.overrides[0].replace("+arm/v=", "+arm/routing_verdict=")
        run.revision = {"commit": ("b" if index == 3 else "a") * 40}
        run.machine = MACHINE
    label_configurations(cells)
    page = page_for(cells)
    assert page.exploratory == "its runs ran 2 versions of the code"
    grid = verdict_grid(cells, page, tmp_path)
    helps = next(line for line in grid.splitlines() if line.startswith("| dynamic |"))
    assert "a difference, exploratory: above (" in helps and "supported" not in helps
    assert grid.rstrip().endswith(
        "Read as exploratory: its runs ran 2 versions of the code; no verdict is kept for model cards."
    )
    assert not (tmp_path / "verdicts.json").exists()
    cells[3].revision = {"commit": "a" * 40}
    assert page_for(cells).exploratory is None


def test_an_equivalence_found_on_an_exploratory_page_is_not_called_equivalent():
    rng = np.random.default_rng(4)
    base = 0.95 + rng.normal(0, 0.004, 10)
    runs = [*runs_of("reference", list(base)), *runs_of("same", list(base + rng.normal(0, 0.0005, 10)))]
    label_configurations(runs)
    declared = (Hypothesis("same", "test/acc", "+arm/v=same", "+arm/v=reference", 0.5, test="permutation", margin=0.5),)
    page = StudyPage(metrics=("test/acc",), references=("+arm/v=reference",), hypotheses=declared)
    (row,) = [row for row in family(group(runs), ["test/acc"], page) if row.hypothesis]
    assert verdict(row, row.p_holm).startswith("**equivalent** within ±0.5 (two one-sided tests")
    assert verdict(row, row.p_holm, exploratory=True).startswith("within ±0.5 (exploratory; two one-sided tests")


@pytest.mark.parametrize(
    ("best", "classes", "warned"), [(0.116, 10, True), (0.2, 10, True), (0.3, 10, False), (0.116, 100, False)]
)
def test_a_fit_that_ends_at_chance_says_the_net_did_not_learn(best, classes, warned, caplog):
    """em_paper in CapsNet's DigitCaps ended its epoch at 11.6% on every seed with nothing said."""
    from omegaconf import OmegaConf

    from capsexp.run.stages import warn_if_not_learned

    cfg = OmegaConf.create({"geometry": {"num_classes": classes}})
    with caplog.at_level("WARNING", logger="capsexp.run.stages"):
        warn_if_not_learned(cfg, {"val/acc_best": best, "val/acc": 0.9})
    said = [r.getMessage() for r in caplog.records]
    if warned:
        assert said == [
            f"val/acc_best {100 * best:.1f}% is not above 2 times chance (10% for 10 classes): this net did not "
            "learn. Its learning rate, its routing's options (model.net.routing) or too few steps are the usual causes."
        ]
    else:
        assert said == []
