"""``attack=fgsm|bim|pgd``: after the test, attack the tested checkpoint on the first test set and log
accuracy against eps (TensorBoard, ``attack_<name>.md`` in the run folder)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf
from torchvision.utils import make_grid

from capsexp.attacks.evaluation import (
    AdversarialEvaluation,
    AttackResult,
    PixelClassifier,
    eps_step,
    metric_name,
    write_results,
)
from capsexp.callbacks.image_logging import tensorboard_writer
from capsexp.errors import ConfigError
from capsexp.figures.images import displayable
from capsexp.records.checkpoints import model_of_run

log = logging.getLogger(__name__)


def attack_tested_model(
    cfg: DictConfig,
    evaluation: AdversarialEvaluation,
    module: L.LightningModule,
    datamodule: L.LightningDataModule,
    trainer: L.Trainer,
    run_folder: Path | None,
) -> dict[str, float]:
    """Attack ``module`` (holding the tested weights) on the DataModule's first test set; the
    accuracy per eps as ``attack/<name>/acc_eps<eps>``."""
    if getattr(datamodule, "objects_per_image", 1) != 1:
        raise ConfigError(
            f"attack={evaluation.method}: the attacks score one object per image; "
            f"{type(datamodule).__name__} has {datamodule.objects_per_image}"
        )
    device = trainer.strategy.root_device
    target = PixelClassifier(module.to(device), datamodule.input_transform)
    source = None
    if evaluation.source:
        source = PixelClassifier(source_classifier(evaluation.source, cfg).to(device), datamodule.input_transform)
    crafted_on = f"crafted on {evaluation.source}" if evaluation.source else "white-box (crafted on the tested model)"
    log.info(f"Attack {evaluation.name}, {crafted_on}: eps {', '.join(f'{e:g}' for e in evaluation.eps)}")
    result = evaluation.run(target, source, pixel_batches(datamodule, device), module.num_classes)

    metrics = {metric_name(evaluation.name, eps): acc for eps, acc in zip(result.eps, result.accuracy, strict=True)}
    for eps, accuracy in zip(result.eps, result.accuracy, strict=True):
        log.info(f"  eps {eps:g}: accuracy {100 * accuracy:.2f}%")
    log_to_tensorboard(result, evaluation.name, trainer)
    if run_folder is not None and trainer.is_global_zero:
        description = (
            f"`{evaluation.method}`{' targeted' if evaluation.targeted else ''}, {crafted_on}, on the first "
            f"test set of `{type(datamodule).__name__}`; model `{type(module.net).__name__}`."
        )
        path = write_results(result, evaluation.name, run_folder, description)
        log.info(f"Attack results: {path}")
    return metrics


def pixel_batches(datamodule: L.LightningDataModule, device: torch.device) -> Iterator[tuple[torch.Tensor, ...]]:
    """The first test set's batches on ``device`` as pixels in [0, 1] with their labels."""
    loaders = datamodule.test_dataloader()
    loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
    for batch in loader:
        images, labels = (tensor.to(device) for tensor in batch)
        yield datamodule.pixel_batch((images, labels), 0)


def source_classifier(ckpt_path: str, cfg: DictConfig) -> L.LightningModule:
    """The model a black-box attack crafts on: built from the config of the run that saved
    ``ckpt_path`` (``<run>/checkpoints/<file>.ckpt``), with the checkpoint's weights."""
    where = f"attack.source={ckpt_path}"
    source = model_of_run(ckpt_path, where)
    ours, theirs = (OmegaConf.to_container(c.geometry, resolve=True) for c in (cfg, source.config))
    if ours != theirs:
        raise ConfigError(
            f"{where} was trained on other data ({_geometry(theirs)}) than this run's ({_geometry(ours)}): "
            "a black-box attack needs a source trained on the same inputs"
        )
    return source.module


def _geometry(geometry: dict[str, Any]) -> str:
    return ", ".join(f"{key} {value}" for key, value in geometry.items())


def log_to_tensorboard(result: AttackResult, name: str, trainer: L.Trainer) -> None:
    """Accuracy against eps (step = eps x 1000), FGSM's beside an iterative attack's, the target
    rate, the zero-gradient fraction, and a grid of adversarial images (a row per eps)."""
    writer = tensorboard_writer(trainer)
    if writer is None:
        return
    for i, eps in enumerate(result.eps):
        writer.add_scalar(f"attack/{name}/acc", result.accuracy[i], eps_step(eps))
        if result.fgsm_accuracy is not None:
            writer.add_scalar(f"attack/{name}/fgsm_acc", result.fgsm_accuracy[i], eps_step(eps))
        if result.target_rate is not None:
            writer.add_scalar(f"attack/{name}/target_rate", result.target_rate[i], eps_step(eps))
    writer.add_scalar(f"attack/{name}/zero_gradient_fraction", result.zero_gradient_fraction, 0)
    writer.add_scalar(f"attack/{name}/unseen_input_fraction", result.unseen_input_fraction, 0)
    per_row = result.examples.shape[1]
    grid = make_grid(displayable(result.examples.flatten(0, 1)), nrow=per_row, pad_value=1.0)
    writer.add_image(f"attack/{name}/examples", grid, 0)
    writer.flush()
