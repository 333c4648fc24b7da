"""Whether the class poses move with the input as the capsule papers say: after testing, small known
transforms of the plain test set's first images, and how the target class's pose and score change.

Sabour et al. (2017, section 1) ask of a capsule's pose that it change with the viewpoint ("equivariance")
while its length, the presence, does not. For each transform (a shift of ``shift`` pixels to the right and
a rotation by ``degrees``, both on the net's input), over the first ``images`` test images:

- ``equivariance/<transform>/error``: the share of the pose change that no one linear map per class
  explains: a map A_k fitted (least squares, a small ridge) from the poses v(x) to v(Tx) on half of the
  images of class k, and on the other half sum ||v(Tx) - A_k v(x)||^2 / sum ||v(Tx) - v(x)||^2. 0: the
  poses move as one linear map of the transform says (equivariant); near 1 or above: the change is not one
  map's (or there is no change to explain);
- ``equivariance/<transform>/pose_change``: mean ||v(Tx) - v(x)|| / mean ||v(x)||: whether the pose moves at all;
- ``equivariance/<transform>/score_change``: the mean absolute change of the target class's score (the
  presence's invariance).

Nets without poses (LeNet5, the baseline CNN) log nothing; CapsNet's fully connected head logs its
features, which its decoder reads as the class capsules are read.
"""

from __future__ import annotations

import lightning as L
import torch
from pydantic import PositiveFloat, PositiveInt
from torchvision.transforms.v2 import functional as TF

from capsexp.callbacks.image_logging import tensorboard_writer
from capsexp.config.arguments import checked

RIDGE = 1e-3  # added to the normal equations' diagonal, as a share of their mean diagonal


@checked
class Equivariance(L.Callback):
    """Written straight to TensorBoard (rank zero) at the run's last step; see the module's docstring."""

    def __init__(self, images: PositiveInt = 1000, shift: PositiveInt = 2, degrees: PositiveFloat = 10.0) -> None:
        self.images, self.shift, self.degrees = images, shift, degrees
        self._kept: dict[str, list[torch.Tensor]] = {}
        self._count = 0

    def transforms(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """The transformed copies of a batch (B, C, H, W) of net inputs, the uncovered pixels given the
        batch's smallest value (the background of a digit on black, standardised or not)."""
        ground = float(images.min())
        shifted = images.roll(self.shift, dims=-1)
        shifted[..., : self.shift] = ground
        rotated = TF.rotate(images, self.degrees, interpolation=TF.InterpolationMode.BILINEAR, fill=ground)
        return {f"shift_{self.shift}px": shifted, f"rotation_{self.degrees:g}deg": rotated}

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._kept, self._count = {}, 0

    @torch.no_grad()
    def on_test_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        images, targets = batch[0], batch[1]
        if dataloader_idx != 0 or self._count >= self.images or targets.ndim != 1 or trainer.global_rank != 0:
            return
        left = self.images - self._count  # images still to measure
        images, targets = images[:left], targets[:left]
        plain = pl_module.net(images)
        poses = getattr(plain, "poses", None)
        if poses is None:
            return
        self._keep("targets", targets)
        self._keep("poses", _of_class(poses, targets))
        self._keep("scores", plain.scores.gather(1, targets[:, None]).squeeze(1))
        for name, moved in self.transforms(images).items():
            output = pl_module.net(moved)
            self._keep(f"{name}/poses", _of_class(output.poses, targets))
            self._keep(f"{name}/scores", output.scores.gather(1, targets[:, None]).squeeze(1))
        self._count += len(images)

    def _keep(self, key: str, values: torch.Tensor) -> None:
        self._kept.setdefault(key, []).append(values.detach().float().cpu())

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        writer = tensorboard_writer(trainer)
        if writer is None or not self._kept:
            return
        kept = {key: torch.cat(values) for key, values in self._kept.items()}
        targets, poses, scores = kept.pop("targets"), kept.pop("poses"), kept.pop("scores")
        for name in {key.split("/")[0] for key in kept}:
            moved, moved_scores = kept[f"{name}/poses"], kept[f"{name}/scores"]
            step = trainer.global_step
            writer.add_scalar(f"equivariance/{name}/error", equivariance_error(poses, moved, targets), step)
            change = (moved - poses).norm(dim=-1).mean() / poses.norm(dim=-1).mean().clamp_min(1e-12)
            writer.add_scalar(f"equivariance/{name}/pose_change", change.item(), step)
            writer.add_scalar(f"equivariance/{name}/score_change", (moved_scores - scores).abs().mean().item(), step)


def _of_class(poses: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(B, K, D) poses -> (B, D), each image's target class's."""
    return poses.gather(1, targets[:, None, None].expand(-1, 1, poses.shape[-1])).squeeze(1)


def equivariance_error(poses: torch.Tensor, moved: torch.Tensor, classes: torch.Tensor) -> float:
    """The share of the pose change (N, D) -> (N, D) that one linear map per class, fitted on the even-numbered
    images of each class, leaves unexplained on the odd-numbered ones (see the module's docstring)."""
    classes = classes.long()
    count = int(classes.max()) + 1
    one_hot = torch.nn.functional.one_hot(classes, count).to(poses.dtype)  # (N, K)
    order = torch.cumsum(one_hot, dim=0).gather(1, classes[:, None]).squeeze(1) - 1  # each image's place in its class
    fit = (order % 2 == 0).to(poses.dtype)[:, None] * one_hot
    # Normal equations per class: (X^T X + ridge) A = X^T Y, over the fitting half.
    gram = torch.einsum("nk,ni,nj->kij", fit, poses, poses)
    cross = torch.einsum("nk,ni,nj->kij", fit, poses, moved)
    diagonal = gram.diagonal(dim1=1, dim2=2).mean(dim=1).clamp_min(1e-12)
    eye = torch.eye(poses.shape[1], dtype=poses.dtype)
    maps = torch.linalg.solve(gram + RIDGE * diagonal[:, None, None] * eye, cross)  # (K, D, D): v(Tx) ~ v(x) A_k
    held_out = order % 2 == 1
    predicted = torch.einsum("ni,nij->nj", poses[held_out], maps[classes[held_out]])
    residual = (moved[held_out] - predicted).pow(2).sum()
    change = (moved[held_out] - poses[held_out]).pow(2).sum()
    return (residual / change.clamp_min(1e-12)).item()
