"""Matrix capsules with EM routing (Hinton, Sabour & Frosst 2018): the smallNORB network of Fig. 1.

ReLU conv1 5x5 stride 2 (A channels) -> PrimaryCaps 1x1 (B types) -> ConvCaps1 KxK stride 2 (C types)
-> ConvCaps2 KxK stride 1 (D types) -> Class capsules (one per class, coordinate addition).
The class activations are the scores.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from capsexp.models.input_check import check_images
from capsexp.nn.matrix_capsules import ClassMatrixCapsules, ConvMatrixCapsules, PrimaryMatrixCapsules


class MatrixCapsNetOutput(NamedTuple):
    scores: torch.Tensor  # (N, classes): class capsule activations in (0, 1)
    poses: torch.Tensor  # (N, classes, P*P): class capsule poses


class MatrixCapsNet(nn.Module):
    """The paper's network; defaults A=B=C=D=32 (about 310K parameters on 2x32x32 smallNORB).

    Args:
        in_channels, image_size, num_classes: input and output geometry.
        A, B, C, D: conv1 channels, primary, ConvCaps1 and ConvCaps2 capsule types.
        K: ConvCaps kernel size. P: pose matrix size. iterations: EM iterations.
        final_lambda, sigma_eps, cost_normalization: see :func:`capsexp.nn.em.em_routing`.
        recompute: in training, keep only each capsule layer's (small) input and recompute its
            routing during the backward pass (activation checkpointing). The vote tensors of all
            layers are then never held at once: about a third less peak memory for a quarter more
            time. Same results.
        conv1_norm: BatchNorm after conv1 (before its ReLU).
        weight_std: initial std of the transformation matrices (None: 1/sqrt(P)).
        route_per_window: ConvCaps route each window's children on their own (see
            :class:`~capsexp.nn.ConvMatrixCapsules`).
    """

    def __init__(
        self,
        in_channels: int = 1,
        num_classes: int = 10,
        A: int = 32,
        B: int = 32,
        C: int = 32,
        D: int = 32,
        K: int = 3,
        P: int = 4,
        iterations: int = 3,
        image_size: int = 28,
        final_lambda: float = 0.01,
        sigma_eps: float = 1e-4,
        cost_normalization: str = "none",
        coordinate_addition: bool = True,
        recompute: bool = False,
        conv1_norm: bool = False,
        weight_std: float | None = None,
        route_per_window: bool = False,
    ) -> None:
        super().__init__()
        self.recompute = recompute
        self.image_shape = (in_channels, image_size, image_size)
        routing = dict(
            pose_size=P,
            iterations=iterations,
            final_lambda=final_lambda,
            sigma_eps=sigma_eps,
            cost_normalization=cost_normalization,
            weight_std=weight_std,
        )
        self.conv1 = nn.Conv2d(in_channels, A, kernel_size=5, stride=2)
        # BatchNorm between conv1 and its ReLU, as yl-1993/Matrix-Capsules-EM-PyTorch has; not in the paper.
        self.conv1_norm = nn.BatchNorm2d(A) if conv1_norm else nn.Identity()
        self.primary = PrimaryMatrixCapsules(A, B, P)
        self.conv_caps1 = ConvMatrixCapsules(B, C, K, stride=2, route_per_window=route_per_window, **routing)
        self.conv_caps2 = ConvMatrixCapsules(C, D, K, stride=1, route_per_window=route_per_window, **routing)
        self.class_caps = ClassMatrixCapsules(D, num_classes, coordinate_addition=coordinate_addition, **routing)

        # Receptive-field centres of the ConvCaps2 positions in input pixels, scaled to [0, 1]:
        # compose each layer's map p -> stride * p + (kernel - 1) / 2.
        scale, offset, size = 1.0, 0.0, image_size
        for kernel, stride in [(5, 2), (K, 2), (K, 1)]:
            offset, scale = offset + scale * (kernel - 1) / 2, scale * stride
            size = (size - kernel) // stride + 1
        if size < 1:
            raise ValueError(f"image_size={image_size} is too small for this network (K={K})")
        centres = (offset + scale * torch.arange(size) + 0.5) / image_size
        self.register_buffer(
            "centres", torch.stack(torch.meshgrid(centres, centres, indexing="ij"), dim=-1), persistent=False
        )

    def _run(self, layer: nn.Module, *inputs: torch.Tensor):
        if self.recompute and torch.is_grad_enabled() and self.training:
            return checkpoint(layer, *inputs, use_reentrant=False)
        return layer(*inputs)

    def forward(self, images: torch.Tensor) -> MatrixCapsNetOutput:
        check_images(images, self.image_shape, "MatrixCapsNet")
        poses, activations = self.primary(F.relu(self.conv1_norm(self.conv1(images))))
        poses, activations = self._run(self.conv_caps1, poses, activations)
        poses, activations = self._run(self.conv_caps2, poses, activations)
        class_poses, class_activations = self._run(self.class_caps, poses, activations, self.centres)
        return MatrixCapsNetOutput(class_activations, class_poses)
