"""CapsNet with dynamic routing (Sabour, Frosst & Hinton 2017, "Dynamic Routing Between Capsules").

conv1 256@9x9 ReLU -> PrimaryCaps 32x8D, 9x9 stride 2 -> DigitCaps (one 16D capsule per class, routing
between PrimaryCaps and DigitCaps only) -> class scores = capsule lengths. Decoder (Fig. 2): the
DigitCaps output with every capsule but one masked out -> FC 512 ReLU -> FC 1024 ReLU -> FC H*W*C
sigmoid. In training the kept capsule is the true class's, otherwise the longest.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from capsexp.arguments import PositiveInt, checked
from capsexp.models.input_check import check_images
from capsexp.nn import DynamicRouting, PrimaryCapsules, RoutingCapsules


class CapsNetOutput(NamedTuple):
    scores: torch.Tensor  # (B, classes): lengths of the class capsules
    poses: torch.Tensor  # (B, classes, pose_dim): the class capsules
    reconstructions: torch.Tensor | None  # (B, C, H, W) in [0, 1], or None without a decoder


@checked
class CapsNet(nn.Module):
    """The paper's MNIST model with its defaults (8,215,568 parameters; 6,804,224 without decoder).

    Args:
        in_channels: image channels (2 for stereo smallNORB).
        image_size: input height and width (28 for MNIST, 32 for smallNORB crops, 40 for affNIST-style).
        num_classes: number of class capsules.
        routing: how PrimaryCaps route to DigitCaps (:class:`~capsexp.nn.DynamicRouting`; the paper's
            3 iterations by default).
        reconstruction: build the decoder (the reconstruction regulariser of section 4.1).
        conv_channels, primary_types, primary_dim, pose_dim: layer widths (paper: 256, 32, 8, 16).
    """

    def __init__(
        self,
        in_channels: PositiveInt = 1,
        image_size: PositiveInt = 28,
        num_classes: PositiveInt = 10,
        reconstruction: bool = True,
        routing: DynamicRouting = DynamicRouting(),
        conv_channels: PositiveInt = 256,
        primary_types: PositiveInt = 32,
        primary_dim: PositiveInt = 8,
        pose_dim: PositiveInt = 16,
    ) -> None:
        super().__init__()
        self.image_shape = (in_channels, image_size, image_size)
        self.num_classes, self.pose_dim = num_classes, pose_dim
        self.conv1 = nn.Conv2d(in_channels, conv_channels, kernel_size=9)
        self.primary = PrimaryCapsules(conv_channels, primary_types, primary_dim, kernel_size=9, stride=2)
        feature_size = image_size - 8
        if feature_size < 9:
            raise ValueError(f"CapsNet: image_size={image_size} is too small for two 9x9 convolutions (needs >= 17)")
        num_primary = self.primary.output_size(feature_size, feature_size)
        self.digits = RoutingCapsules(
            num_primary, primary_dim, num_classes, pose_dim, routing.iterations, routing.detach_agreement
        )
        self.decoder = (
            nn.Sequential(
                nn.Linear(num_classes * pose_dim, 512),
                nn.ReLU(inplace=True),
                nn.Linear(512, 1024),
                nn.ReLU(inplace=True),
                nn.Linear(1024, in_channels * image_size * image_size),
                nn.Sigmoid(),
            )
            if reconstruction
            else None
        )

    def decode(self, poses: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        """Reconstruct images from class capsules (B, classes, pose_dim), keeping only ``classes`` (B,)."""
        if self.decoder is None:
            raise RuntimeError("this CapsNet was built with reconstruction=False: it has no decoder")
        mask = F.one_hot(classes, self.num_classes).to(poses.dtype).unsqueeze(-1)
        return self.decoder((poses * mask).flatten(1)).view(-1, *self.image_shape)

    def forward(self, images: torch.Tensor, targets: torch.Tensor | None = None) -> CapsNetOutput:
        check_images(images, self.image_shape, "CapsNet")
        # In place: conv1's backward needs its input, not its output; saves a 52 MB buffer at batch 128.
        primary = self.primary(F.relu(self.conv1(images), inplace=True))
        poses = self.digits(primary)  # (B, classes, pose_dim)
        # vector_norm's gradient at a zero vector is 0, not NaN.
        lengths = torch.linalg.vector_norm(poses, dim=-1)
        reconstructions = None
        if self.decoder is not None:
            reconstructions = self.decode(poses, targets if targets is not None else lengths.argmax(dim=-1))
        return CapsNetOutput(lengths, poses, reconstructions)
