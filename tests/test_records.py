"""Records that are right: the code a run ran (changed code only, diffs as bytes), every revision of a
resumed run on its card, how much of each split a run used, and the docs' table of what scores are."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from capsexp.config.instantiation import build_model
from capsexp.records.model_card import _used
from capsexp.records.revision import describe, read_revision
from capsexp.use.inference import score_kind
from tests.helpers import PROJECT_ROOT, TINY_RUN, compose_config, run_cli_in_process, write_mnist


def git(root: Path, *arguments: str) -> None:
    subprocess.run(["git", *arguments], cwd=root, check=True, capture_output=True)


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A git checkout laid out as capsexp's, one commit."""
    for name in ("src/capsexp/a.py", "conf/config.yaml", "README.md", "experiments/results/page.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    git(tmp_path, "init", "-q")
    git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "first")
    return tmp_path


def test_files_that_are_not_code_leave_the_revision_clean(checkout):
    (checkout / "my_digits").mkdir()
    (checkout / "my_digits" / "7.png").write_bytes(b"\x89PNG...")
    (checkout / "logs").mkdir()
    (checkout / "logs" / "run.log").write_text("a log")
    (checkout / "experiments" / "results" / "new_page.md").write_text("a page")
    record = describe(checkout)
    assert record["dirty"] is False and record["diff_sha256"] is None and len(record["commit"]) == 40


def test_changed_code_and_untracked_code_mark_the_run_each_with_its_own_hash(checkout):
    (checkout / "src" / "capsexp" / "new.py").write_text("y = 2\n")
    untracked = describe(checkout)
    (checkout / "conf" / "config.yaml").write_text("x = 3\n")
    both = describe(checkout)
    assert untracked["dirty"] and both["dirty"] and untracked["diff_sha256"] != both["diff_sha256"]


def test_a_changed_file_that_is_not_utf8_is_hashed_as_bytes(checkout):
    (checkout / "latin1.txt").write_bytes("na\xefve\n".encode("latin-1"))
    first = describe(checkout)
    (checkout / "latin1.txt").write_bytes("na\xefvet\xe9\n".encode("latin-1"))
    assert first["dirty"] and describe(checkout)["diff_sha256"] != first["diff_sha256"]


@pytest.mark.parametrize(
    "limits,expected",
    [
        ({}, "train: all, val: all, test: all"),
        (
            {"limit_val_batches": 1, "limit_test_batches": 1.0, "limit_train_batches": 0.25},
            "train: 25% (limit_train_batches=0.25), val: 1 batch (limit_val_batches=1), test: all",
        ),
        ({"limit_test_batches": 30}, "train: all, val: all, test: 30 batches (limit_test_batches=30)"),
    ],
)
def test_the_card_reads_a_whole_number_limit_as_batches_and_a_fraction_as_a_share(limits, expected):
    assert _used(limits) == expected


def test_a_resumed_runs_card_names_the_code_of_each_part(tmp_path):
    data_dir = write_mnist(tmp_path / "data")
    run = tmp_path / "run"
    common = [*TINY_RUN, "model=lenet5", f"paths.data_dir={data_dir}", "trainer.val_check_interval=2"]
    first = run_cli_in_process(*common, "trainer.max_steps=2", f"hydra.run.dir={run}")
    assert first.returncode == 0, first.stderr[-2000:]
    # The first part ran other code (another commit): what revision.yaml would hold had it.
    (run / "revision.yaml").write_text("version: 0.1.0\ncommit: " + "a" * 40 + "\ndirty: false\ndiff_sha256: null\n")
    resumed = run_cli_in_process(f"ckpt_path={run}", "trainer.max_steps=4")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    card = (run / "model_card.md").read_text()
    (code,) = [line for line in card.splitlines() if line.startswith("| code |")]
    assert "aaaaaaa, then " in code and read_revision(run)["earlier"][0]["commit"] == "a" * 40


def score_table() -> list[tuple[list[list[str]], str]]:
    """docs/predict.md's table of scores: each row's override lists (a bare name after a comma replaces the
    last option of the first) and the score its second cell names (up to the colon or bracket)."""
    text = (PROJECT_ROOT / "docs" / "predict.md").read_text()
    table = text.split("| configs | score |", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in table.strip().splitlines()[1:]:
        configs, score = [cell.strip() for cell in line.strip("|").split(" | ")]
        first, *others = re.findall(r"`([^`]+)`", configs)
        base = first.split()
        key = base[-1].split("=")[0]
        rows.append(
            ([base, *([*base[:-1], f"{key}={other}"] for other in others)], re.split(r"[:(]", score)[0].strip())
        )
    return rows


@pytest.mark.slow
def test_the_docs_name_each_models_scores_as_the_code_does():
    rows = score_table()
    for overrides_list, named in rows:
        for overrides in overrides_list:
            module = build_model("model", compose_config(overrides).model)
            assert score_kind(module) == named, (overrides, score_kind(module), named)
    listed = {o for overrides_list, _ in rows for overrides in overrides_list for o in overrides}
    models = {f"model={p.stem}" for p in (PROJECT_ROOT / "conf" / "model").glob("*.yaml")}
    assert models <= listed, models - listed
    from capsexp.config.routing_registry import built_in as routings

    assert {f"model/routing={name}" for name in routings()} <= listed


def test_a_job_records_the_code_its_process_imported_and_says_when_the_checkout_changed_since(checkout):
    """A launcher's worker imports the code once and runs many jobs: each job's record is the code of
    that import, with the checkout's later state beside it, not the checkout at the job's start."""
    from capsexp.records.revision import at_import, of_this_process, short

    imported = at_import(checkout)
    assert of_this_process(checkout) == imported  # nothing changed: the record alone
    (checkout / "src" / "capsexp" / "a.py").write_text("x = 2\n")  # a commit or edit while the worker runs
    later = of_this_process(checkout)
    assert {k: v for k, v in later.items() if k != "changed_since_import"} == imported
    assert later["changed_since_import"] == describe(checkout) and later["changed_since_import"]["dirty"]
    assert short(later).startswith(f"{imported['commit'][:7]} (the checkout then {imported['commit'][:7]}+changes ")
    assert at_import(checkout) == imported  # asked again: still the import's


def test_the_cards_results_give_accuracies_in_per_cent_and_other_measures_as_they_are():
    """Every accuracy the card shows (the best validation one, each test set's) in per cent, the presence gap
    as the number it is; values that a fraction and a percentage would print alike are avoided."""
    from capsexp.records.machine import describe as describe_machine
    from capsexp.records.metric_names import PRESENCE_GAP
    from capsexp.records.model_card import CardFacts, model_card

    metrics = {"val/acc_best": 0.9875, "test/acc": 0.9712, "test/acc_rotated_30": 0.4375, PRESENCE_GAP: 0.123}
    facts = CardFacts(
        net="LeNet5", choices={"model": "lenet5", "data": "mnist"}, config={}, parameters=61706, flops=0.4e6,
        split_sizes={"train": 55000}, class_names=list(range(10)), metrics=metrics, train_seconds=12.0,
        machine=describe_machine(), revision=None, checkpoint="run/checkpoints/best.ckpt", run_folder="run",
        overrides=["model=lenet5"], tested_sha256=None, precision="32-true",
    )  # fmt: skip
    cells = [line.strip("|").split(" | ") for line in model_card(facts).splitlines() if line.count(" | ") == 1]
    rows = {name.strip(): value.strip() for name, value in cells}
    assert rows["val/acc_best"] == "98.75%" and rows["test/acc"] == "97.12%" and rows["test/acc_rotated_30"] == "43.75%"
    assert rows[PRESENCE_GAP] == "0.123"


@pytest.mark.parametrize(
    "never_validates",
    [["trainer.limit_val_batches=0"], ["trainer.val_check_interval=10"]],  # 10 batches: past max_steps=2
    ids=["no validation batches", "validation after the last step"],
)
def test_the_card_of_a_run_that_never_validated_says_it_tested_the_final_weights(never_validates, tmp_path):
    data_dir = write_mnist(tmp_path / "data")
    run = tmp_path / "run"
    common = [*TINY_RUN, "model=lenet5", f"paths.data_dir={data_dir}", "trainer.max_steps=2"]
    result = run_cli_in_process(*common, *never_validates, f"hydra.run.dir={run}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.ckpt"]  # no best to test
    card = (run / "model_card.md").read_text()
    assert "the best by" not in card and "val/acc_best" not in card
    assert (
        "Tested: the final weights (saved as `checkpoints/last.ckpt`), never validated: the run saved no best "
        "checkpoint by val/acc to test." in card
    )
    assert "| test/acc |" in card


def test_the_cards_predict_command_pasted_into_a_shell_names_the_model_it_describes():
    """A training run: its folder (a job folder of a sweep, in a folder with a space); a test-only run (the
    checkpoint it tested, trained by another run: its own folder holds none): that checkpoint."""
    import shlex

    from capsexp.records.machine import describe as describe_machine
    from capsexp.records.model_card import CardFacts, use_command

    def facts(**given) -> CardFacts:
        return CardFacts(
            net="LeNet5", choices={}, config={}, parameters=1, flops=1.0, split_sizes={}, class_names=[], metrics={},
            train_seconds=None, machine=describe_machine(), revision=None, **given,
        )  # fmt: skip

    folder = "my runs/multiruns/2026-12-07/model=lenet5,seed=1"
    trained = facts(checkpoint=f"{folder}/checkpoints/epoch_001.ckpt", run_folder=folder)
    assert shlex.split(use_command(trained)) == ["python", "-m", "capsexp.predict", f"ckpt_path={folder}"]
    tested = facts(checkpoint="/elsewhere/best.ckpt", run_folder="logs/eval/runs/x", tested_sha256="ab" * 32)
    assert shlex.split(use_command(tested))[-1] == "ckpt_path=/elsewhere/best.ckpt"
