"""python -m capsexp.tensorboard (make tensorboard): runs named by what they ran, accuracy pinned first,
HParams columns from every run's choices."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

from lightning.pytorch.loggers import TensorBoardLogger

from capsexp.run.hparams import log_hyperparameters
from capsexp.tensorboard import COLUMNS_RUN, link_runs, main, short_name, url, write_columns
from tests.helpers import load_events


def make_run(folder: Path, choices: dict, logged: dict) -> None:
    logger = TensorBoardLogger(str(folder), name="", version="", default_hp_metric=False)
    log_hyperparameters([logger], {"seed": choices.get("seed", 1)}, choices)
    logger.log_metrics(logged, step=1)
    logger.finalize("success")


def columns(folder: Path) -> tuple[list[str], list[str]]:
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = load_events(folder).PluginTagToContent("hparams")["_hparams_/experiment"]
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content).experiment
    return [i.name for i in experiment.hparam_infos], [i.name.tag for i in experiment.metric_infos]


def test_a_mixed_logs_folder_is_served_with_short_names_and_every_runs_choices_as_columns(tmp_path):
    logs = tmp_path / "logs"
    sweep = logs / "train" / "multiruns" / "2026-11-27_20-48-08-501234"
    make_run(
        sweep / "model=capsnet,model.routing=em,seed=1",
        {"model": "capsnet", "data": "mnist", "seed": 1, "model/routing": "em"},
        {"val/acc": 0.9, "val/acc_best": 0.9, "test/acc": 0.91, "test/acc_affine_mnist": 0.6, "grad_norm": 1.0},
    )
    make_run(sweep / "model=lenet5,seed=1", {"model": "lenet5", "data": "mnist", "seed": 1}, {"val/acc": 0.8})
    single = logs / "train" / "runs" / "2026-11-28_09-15-30-000017_data=image_folder,data.root=photos"
    make_run(single, {"model": "capsnet", "data": "image_folder", "seed": 2, "data/root": "photos"}, {"val/acc": 0.5})

    # The part that differs first: the sidebar's cut (about 45 characters) no longer hides it.
    assert short_name(sweep / "model=lenet5,seed=1", logs) == "model=lenet5,seed=1 (11-27 20-48)"
    assert short_name(single, logs) == "data=image_folder,data.root=photos (11-28 09-15-30)"
    links = tmp_path / "served"
    links.mkdir()
    assert link_runs(logs, links) == 3 and link_runs(logs, links) == 0  # a rescan links only new runs
    assert sorted(p.name for p in links.iterdir()) == [
        "data=image_folder,data.root=photos (11-28 09-15-30)",
        "model=capsnet,model.routing=em,seed=1 (11-27 20-48)",
        "model=lenet5,seed=1 (11-27 20-48)",
    ]

    # Every run's choices are columns, the leading ones first, whichever run made them.
    write_columns(sorted(p.resolve() for p in links.iterdir()), links / COLUMNS_RUN)
    hparams, metrics = columns(links / COLUMNS_RUN)
    assert hparams == ["model", "data", "model/routing", "seed", "data/root"]
    assert metrics == ["val/acc_best", "test/acc", "test/acc_affine_mnist", "val/acc"]  # no grad_norm


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
