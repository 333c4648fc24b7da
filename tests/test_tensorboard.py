"""python -m capsexp.tensorboard (make tensorboard): runs named by what they ran, accuracy pinned first,
HParams columns from every run's choices."""

from __future__ import annotations

import json
import re
import shlex
import urllib.parse
from pathlib import Path

import pytest
from lightning.pytorch.loggers import TensorBoardLogger

from capsexp.run.hparams import log_hyperparameters
from capsexp.run.run_folder import say_run_folder
from capsexp.tensorboard import COLUMNS_RUN, link_runs, main, served_names, url, write_columns
from tests.helpers import load_events


def make_run(folder: Path, choices: dict, logged: dict) -> None:
    logger = TensorBoardLogger(str(folder), name="", version="", default_hp_metric=False)
    log_hyperparameters([logger], {"seed": choices.get("seed", 1)}, choices)
    logger.log_metrics(logged, step=1)
    logger.finalize("success")


def columns(folder: Path) -> tuple[list[str], list[str], list[str]]:
    """The experiment summary's hyperparameters, its metrics, and the hyperparameters marked as differing."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = load_events(folder).PluginTagToContent("hparams")["_hparams_/experiment"]
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content).experiment
    infos = experiment.hparam_infos
    return [i.name for i in infos], [i.name.tag for i in experiment.metric_infos], [i.name for i in infos if i.differs]


def test_a_mixed_logs_folder_is_served_with_short_names_and_every_runs_choices_as_columns(tmp_path):
    logs = tmp_path / "logs"
    sweep = logs / "train" / "multiruns" / "2026-11-27_20-48-08-501234"
    make_run(
        sweep / "model=capsnet,model.routing=em,seed=1",
        {"model": "capsnet", "data": "mnist", "seed": 1, "model/routing": "em", "trainer/max_epochs": 1},
        {"val/acc": 0.9, "val/acc_best": 0.9, "test/acc": 0.91, "test/acc_affine_mnist": 0.6, "grad_norm": 1.0},
    )
    make_run(
        sweep / "model=lenet5,seed=1",
        {"model": "lenet5", "data": "mnist", "seed": 1, "trainer/max_epochs": 1},
        {"val/acc": 0.8},
    )
    single = logs / "train" / "runs" / "2026-11-28_09-15-30-000017_data=image_folder,data.root=photos"
    make_run(
        single,
        {"model": "capsnet", "data": "image_folder", "seed": 2, "data/root": "photos", "trainer/max_epochs": 1},
        {"val/acc": 0.5},
    )

    # How each run differs, by short keys (a location such as data.root is none of it), a value most runs
    # share (seed=1, no routing) left unsaid: the sidebar's cut (about 30 characters) no longer hides it.
    links = tmp_path / "served"
    links.mkdir()
    assert link_runs(logs, links) == 3 and link_runs(logs, links) == 0  # a rescan links only new runs
    assert sorted(p.name for p in links.iterdir()) == [
        "data=image_folder (11-28 09-15-30)",
        "model=capsnet,routing=em (11-27 20-48)",
        "model=lenet5 (11-27 20-48)",
    ]

    # Every run's choices are columns, whichever run made them; those that differ (or that some runs lack)
    # marked and first, so that the HParams view ticks them; what every run shares last.
    write_columns(sorted(p.resolve() for p in links.iterdir()), links / COLUMNS_RUN)
    hparams, metrics, differing = columns(links / COLUMNS_RUN)
    assert hparams == ["model", "data", "model/routing", "seed", "data/root", "trainer/max_epochs"]
    assert differing == ["model", "data", "model/routing", "seed", "data/root"]
    assert metrics == ["val/acc_best", "test/acc", "test/acc_affine_mnist", "val/acc"]  # no grad_norm


def test_single_runs_are_named_by_the_override_that_differs_with_its_short_key(tmp_path):
    """Two single runs whose folder names are cut to a digest (too long): their recorded overrides name
    them, by what differs, with trainer.max_steps as max_steps."""
    logs = tmp_path / "logs"
    folders = []
    for steps, stamp in ((600, "2026-11-29_01-00-00-000001"), (1200, "2026-11-29_02-30-15-000002")):
        overrides = ["model=capsnet_small", f"trainer.max_steps={steps}", "trainer.val_check_interval=300", "seed=1"]
        folder = logs / "train" / "runs" / f"{stamp}_model=capsnet_small,trainer.max_steps={steps},trai~0123456789"
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "overrides.yaml").write_text(
            "".join(f"- {o}\n" for o in [*overrides, "paths.data_dir=/d"])
        )
        folders.append(folder)
    names = served_names(folders, logs)
    assert [names[f] for f in folders] == ["max_steps=600 (11-29 01-00-00)", "max_steps=1200 (11-29 02-30-15)"]
    # A third run of 1200 steps: most runs share that length, and the one that differs says so.
    third = (
        logs
        / "train"
        / "runs"
        / (
            "2026-11-29_03-00-00-000003_model=capsnet_small,trainer.max_steps=1200,trainer.val_check_interval=300,seed=2"
        )
    )
    names = served_names([*folders, third], logs)
    assert [names[f] for f in [*folders, third]] == [
        "max_steps=600 (11-29 01-00-00)",
        "max_steps=1200,seed=1 (11-29 02-30-15)",  # the shared values of every key: all of them
        "seed=2 (11-29 03-00-00)",
    ]
    assert served_names(folders[:1], logs)[folders[0]].startswith("model=capsnet_small,max_steps=600,")


def test_the_url_pins_the_accuracy_cards_and_an_empty_folder_is_refused(tmp_path, capsys):
    query = urllib.parse.urlparse(url(6006)).query
    pinned = json.loads(urllib.parse.parse_qs(query)["pinnedCards"][0])
    assert [card["tag"] for card in pinned] == ["val/acc", "val/acc_best", "test/acc"]
    assert url(6006).endswith("#timeseries")
    try:
        main([str(tmp_path)])
    except SystemExit as exit_info:
        assert exit_info.code == 2
    assert "no runs under" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name,served_as",
    [
        ("lenet5_run", "lenet5_run"),  # hydra.run.dir of one's own
        ("model=capsnet,seed=2", "model=capsnet,seed=2"),  # a sweep's job
        ("2026-12-06_10-00-00-000001_model=capsnet", "model=capsnet (12-06 10-00-00)"),  # a single run's
    ],
)
def test_the_tensorboard_command_a_run_prints_serves_it_by_its_name_not_as_a_dot(
    name, served_as, tmp_path, monkeypatch, caplog
):
    """The command a run ends with, as printed (its folder relative to where the run started): TensorBoard
    lists the run under its folder's name, or for a folder laid out as capsexp's, what it ran and when."""
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "logs" / name
    make_run(folder, {"model": "capsnet", "seed": 2}, {"val/acc": 0.5})
    with caplog.at_level("INFO", logger="capsexp.run.run_folder"):
        say_run_folder(folder, finished=True)
    (printed,) = re.findall(r"\(TensorBoard: (.*)\)$", caplog.text, re.MULTILINE)
    command = shlex.split(printed)
    assert command == ["python", "-m", "capsexp.tensorboard", f"logs/{name}"]
    links = tmp_path / "served"  # what the command serves (main links the runs, then starts TensorBoard)
    links.mkdir()
    assert link_runs(Path(command[3]), links) == 1
    multiplexer = EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(links))
    multiplexer.Reload()
    assert list(multiplexer.Runs()) == [served_as]
