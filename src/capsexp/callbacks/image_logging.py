"""TensorBoard figures of capsule models: reconstructions and pose perturbations.

Both callbacks do nothing for nets without a decoder (LeNet5), so they sit in the default callbacks.
Images are written once, by the global rank zero, with ``torchvision.utils.make_grid``.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from pydantic import PositiveFloat, PositiveInt
from torchvision.utils import make_grid

from capsexp.config.arguments import checked
from capsexp.figures.images import (
    PERTURBATION_DELTA,
    PERTURBATION_STEPS,
    displayable,
    overlaid,
    perturbed_reconstructions,
    upscaled,
)
from capsexp.records.metric_names import RECONSTRUCTIONS


def tensorboard_writer(trainer: L.Trainer) -> Any | None:
    """The SummaryWriter of the trainer's TensorBoard logger, on global rank zero only."""
    if not trainer.is_global_zero:
        return None
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            return logger.experiment
    return None


@checked
class ReconstructionGrid(L.Callback):
    """Every validation epoch: ``num_images`` validation inputs (top row) above their reconstructions
    (bottom row), each enlarged ``scale`` times (:func:`upscaled`); with several objects per image, the
    objects' reconstructions overlaid in colours (:func:`overlaid`)."""

    def __init__(self, num_images: PositiveInt = 8, scale: PositiveInt = 3) -> None:
        self.num_images, self.scale = num_images, scale
        self.images: torch.Tensor | None = None

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if batch_idx == 0 and dataloader_idx == 0:
            self.images = batch[0][: self.num_images].detach()

    @torch.no_grad()
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        writer = tensorboard_writer(trainer)
        if trainer.sanity_checking or writer is None or self.images is None:
            return
        reconstructions = getattr(pl_module(self.images), "reconstructions", None)
        if reconstructions is None:
            return
        images = self.images
        if reconstructions.ndim == 5:
            images, reconstructions = images.expand(-1, 3, -1, -1), overlaid(reconstructions)
        shown = upscaled(displayable(torch.cat([images, reconstructions])), self.scale)
        grid = make_grid(shown, nrow=len(images), padding=2 * self.scale)
        writer.add_image(RECONSTRUCTIONS, grid, trainer.global_step)


@checked
class PosePerturbation(L.Callback):
    """After testing: the paper's Fig. 4. For ``num_examples`` test digits, each dimension of the
    predicted class capsule is tweaked by ``steps`` values evenly spaced over
    [-max_delta, max_delta] and decoded: one grid per digit, a row per dimension, a column per step,
    each image enlarged ``scale`` times."""

    def __init__(
        self,
        num_examples: PositiveInt = 4,
        steps: PositiveInt = PERTURBATION_STEPS,
        max_delta: PositiveFloat = PERTURBATION_DELTA,
        scale: PositiveInt = 3,
    ) -> None:
        self.num_examples, self.steps, self.max_delta, self.scale = num_examples, steps, max_delta, scale
        self.images: torch.Tensor | None = None

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if batch_idx == 0 and dataloader_idx == 0:
            self.images = batch[0][: self.num_examples].detach()

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        writer = tensorboard_writer(trainer)
        net = getattr(pl_module, "net", None)
        if writer is None or self.images is None or getattr(net, "decoder", None) is None:
            return
        figures = perturbed_reconstructions(net, self.images, self.steps, self.max_delta)
        for index, figure in enumerate(figures):
            shown = upscaled(displayable(figure.flatten(0, 1)), self.scale)
            grid = make_grid(shown, nrow=self.steps, padding=self.scale)
            writer.add_image(f"test/pose_perturbation_{index}", grid, trainer.global_step)
