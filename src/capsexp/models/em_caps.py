"""Matrix capsules with EM routing (Hinton, Sabour & Frosst 2018): the smallNORB network of Fig. 1.

ReLU conv1 5x5 stride 2 (A channels) -> PrimaryCaps 1x1 (B types) -> ConvCaps1 KxK stride 2 (C types)
-> ConvCaps2 KxK stride 1 (D types) -> Class capsules (one per class, coordinate addition).
The class activations are the scores.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from pydantic import PositiveFloat, PositiveInt
from torch import nn

from capsexp.config.arguments import checked
from capsexp.models.input_check import check_images
from capsexp.nn import (
    Backbone,
    ClassMatrixCapsules,
    ConvMatrixCapsules,
    EMRouting,
    PrimaryMatrixCapsules,
    ResNetStem,
    RoutingOptions,
)


class MatrixCapsNetOutput(NamedTuple):
    scores: torch.Tensor  # (N, classes): class capsule activations in (0, 1)
    poses: torch.Tensor  # (N, classes, P*P): class capsule poses


@checked
class MatrixCapsNet(nn.Module):
    """The paper's network; defaults A=B=C=D=32 (about 310K parameters on 2x32x32 smallNORB). The
    defaults are ``model=em_caps``'s net (its config sets only the data's geometry).

    Args:
        in_channels, image_size, num_classes: input and output geometry.
        conv_channels: conv1 channels (the paper's A).
        primary_types: PrimaryCaps capsule types (B).
        conv_caps1_types, conv_caps2_types: ConvCaps1 and ConvCaps2 capsule types (C, D).
        kernel_size: ConvCaps kernel size (K). pose_size: pose matrices are pose_size x pose_size (P).
        routing: how every capsule layer routes: :class:`~capsexp.nn.EMRouting` (its defaults are
            capsexp's recipe), :class:`~capsexp.nn.VBRouting` (variational Bayes routing, model=vb_caps),
            or any other registered routing (``model/routing=<name>``), whose router each layer hands its
            votes as flattened 4x4 poses (:class:`~capsexp.nn.Routing` says what it receives per layer).
        conv1_norm: BatchNorm after conv1 (before its ReLU), as yl-1993/Matrix-Capsules-EM-PyTorch has;
            not in the paper (model=em_caps_paper: false). The arm no_batchnorm of experiment=em_training
            trains without it.
        primary_norm: BatchNorm on PrimaryCaps' poses and activation logits, as the variational Bayes
            routing authors' net has (:class:`~capsexp.nn.PrimaryMatrixCapsules`; model=vb_caps).
        weight_std: initial std of the transformation matrices (None: 1/sqrt(P)).
        backbone: ``conv`` (the paper's conv1 alone) or ``resnet``: a small ResNet stem
            (:class:`~capsexp.nn.ResNetStem`, ``conv_channels`` channels at the image's size) before conv1,
            for colour data; the layers' geometry is unchanged.
    """

    def __init__(
        self,
        in_channels: PositiveInt = 1,
        num_classes: PositiveInt = 10,
        conv_channels: PositiveInt = 32,
        primary_types: PositiveInt = 32,
        conv_caps1_types: PositiveInt = 32,
        conv_caps2_types: PositiveInt = 32,
        kernel_size: PositiveInt = 3,
        pose_size: PositiveInt = 4,
        image_size: PositiveInt = 28,
        routing: RoutingOptions = EMRouting(),
        coordinate_addition: bool = True,
        conv1_norm: bool = True,
        primary_norm: bool = False,
        weight_std: PositiveFloat | None = None,
        backbone: Backbone = "conv",
    ) -> None:
        super().__init__()
        self.image_shape = (in_channels, image_size, image_size)
        # Receptive-field centres of the ConvCaps2 positions in input pixels, scaled to [0, 1]:
        # compose each layer's map p -> stride * p + (kernel - 1) / 2.
        scale, offset, size = 1.0, 0.0, image_size
        for kernel, stride in [(5, 2), (kernel_size, 2), (kernel_size, 1)]:
            offset, scale = offset + scale * (kernel - 1) / 2, scale * stride
            size = (size - kernel) // stride + 1
        if size < 1:
            raise ValueError(
                f"MatrixCapsNet: image_size={image_size} is too small for this network (kernel_size={kernel_size})"
            )
        centres = (offset + scale * torch.arange(size) + 0.5) / image_size
        self.register_buffer(
            "centres", torch.stack(torch.meshgrid(centres, centres, indexing="ij"), dim=-1), persistent=False
        )

        layer = dict(pose_size=pose_size, routing=routing, weight_std=weight_std)
        self.stem = ResNetStem(in_channels, conv_channels) if backbone == "resnet" else nn.Identity()
        self.conv1 = nn.Conv2d(
            conv_channels if backbone == "resnet" else in_channels, conv_channels, kernel_size=5, stride=2
        )
        # BatchNorm between conv1 and its ReLU, as yl-1993/Matrix-Capsules-EM-PyTorch has; not in the paper.
        self.conv1_norm = nn.BatchNorm2d(conv_channels) if conv1_norm else nn.Identity()
        self.primary = PrimaryMatrixCapsules(conv_channels, primary_types, pose_size, primary_norm)
        self.conv_caps1 = ConvMatrixCapsules(primary_types, conv_caps1_types, kernel_size, stride=2, **layer)
        self.conv_caps2 = ConvMatrixCapsules(conv_caps1_types, conv_caps2_types, kernel_size, stride=1, **layer)
        self.class_caps = ClassMatrixCapsules(
            conv_caps2_types, num_classes, coordinate_addition=coordinate_addition, in_positions=size * size, **layer
        )

    @property
    def score_kind(self) -> str:
        """What its class scores are called where they are presence scores: as its class capsules declare."""
        return self.class_caps.score_kind

    def forward(self, images: torch.Tensor) -> MatrixCapsNetOutput:
        check_images(images, self.image_shape, "MatrixCapsNet")
        # In float32 under mixed precision too: bf16 poses and activations (rounded by 2^-8) moved the
        # paper recipe's gradients by a third against float32's, and the routing, nearly all of the
        # work, runs in float32 anyway.
        with torch.autocast(device_type=images.device.type, enabled=False):
            if images.dtype in (torch.float16, torch.bfloat16):
                images = images.float()
            poses, activations = self.primary(F.relu(self.conv1_norm(self.conv1(self.stem(images)))))
            poses, activations = self.conv_caps1(poses, activations)
            poses, activations = self.conv_caps2(poses, activations)
            class_poses, class_activations = self.class_caps(poses, activations, self.centres)
        return MatrixCapsNetOutput(class_activations, class_poses)
