"""The facts of a finished run its model card is written from (:mod:`capsexp.records.model_card`)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import lightning as L

from capsexp.locations import shown_path
from capsexp.records.machine import describe as describe_machine
from capsexp.records.metric_names import MODEL_FLOPS, MODEL_PARAMETERS
from capsexp.records.model_card import CardFacts
from capsexp.records.verdicts import verdict_of

if TYPE_CHECKING:
    from capsexp.run.stages import RunFacts


def card_facts(
    run: RunFacts, module: L.LightningModule, datamodule: L.LightningDataModule, trainer: L.Trainer, folder: Path
) -> CardFacts:
    """The card of ``run``: what was logged, trained and tested."""
    tested, trained = run.tested, run.train_seconds is not None
    return CardFacts(
        net=type(getattr(module, "net", module)).__name__,
        choices=run.chosen,
        config=run.hparams,
        parameters=run.hparams[MODEL_PARAMETERS],
        flops=run.hparams[MODEL_FLOPS],
        split_sizes=split_sizes(datamodule),
        class_names=getattr(datamodule, "class_names", []),
        metrics=run.metrics,
        train_seconds=run.train_seconds,
        machine=describe_machine(),
        revision=module.run_record.revision if module.run_record else None,
        checkpoint=str(shown_path(Path(tested))) if tested else None,
        run_folder=str(shown_path(folder)),
        overrides=run.overrides,
        tested_sha256=file_sha256(Path(tested)) if tested and not trained else None,
        precision=str(trainer.precision),
        routing=(routing := chosen_routing(run.hparams)),
        verdicts=verdict_of(routing) if routing else (),
    )


def chosen_routing(config) -> str | None:
    """The ``model/routing`` option the run chose and its net routes with (None outside a Hydra run, for a
    net without a routing, or with the fully connected head in the capsule layer's place)."""
    from hydra.core.hydra_config import HydraConfig

    net = (config.get("model") or {}).get("net") or {}
    if not HydraConfig.initialized() or "routing" not in net or net.get("head") == "fully_connected":
        return None
    return HydraConfig.get().runtime.choices.get("model/routing")


def file_sha256(path: Path) -> str | None:
    """The SHA-256 of a file, read in chunks (None where it is not a file: an alias Lightning resolved)."""
    if not path.is_file():
        return None
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def split_sizes(datamodule: L.LightningDataModule) -> dict[str, int]:
    """Images (MultiMNIST: pairs) in each split the DataModule set up, each extra test set by its name."""
    sizes = {}
    for name in ("train", "val", "test"):
        dataset = getattr(datamodule, f"data_{name}", None)
        if dataset is not None:
            sizes[name] = len(dataset)
    names = list(getattr(datamodule, "test_set_names", []))[1:]
    for name, dataset in zip(names, getattr(datamodule, "extra_tests", ()), strict=False):
        sizes[f"test {name}"] = len(dataset)
    return sizes
