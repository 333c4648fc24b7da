"""CapsNet with dynamic routing (Sabour, Frosst & Hinton 2017, "Dynamic Routing Between Capsules").

conv1 256@9x9 ReLU -> PrimaryCaps 32x8D, 9x9 stride 2 -> DigitCaps (one 16D capsule per class, routing
between PrimaryCaps and DigitCaps only) -> class scores = capsule lengths. Decoder (Fig. 2): the
DigitCaps output with every capsule but one masked out -> FC 512 ReLU -> FC 1024 ReLU -> FC H*W*C
sigmoid. In training the kept capsule is the true class's, otherwise the longest. With several objects
per image (MultiMNIST, section 6) each is reconstructed from its own capsule: the true classes' in
training, otherwise the ``objects`` longest.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from pydantic import PositiveInt
from torch import nn

from capsexp.config.arguments import checked
from capsexp.models.input_check import check_images
from capsexp.nn import DynamicRouting, PrimaryCapsules, RoutingCapsules, RoutingOptions


class CapsNetOutput(NamedTuple):
    scores: torch.Tensor  # (B, classes): the class capsules' activations (dynamic routing: their lengths)
    poses: torch.Tensor  # (B, classes, pose_dim): the class capsules
    # (B, C, H, W) in [0, 1], or (B, T, C, H, W) for T objects per image; None without a decoder
    reconstructions: torch.Tensor | None


@checked
class CapsNet(nn.Module):
    """The paper's MNIST model with its defaults (8,215,568 parameters; 6,804,224 without decoder).

    Args:
        in_channels: image channels (2 for stereo smallNORB).
        image_size: input height and width (28 for MNIST, 32 for smallNORB crops, 40 for affNIST-style).
        num_classes: number of class capsules.
        routing: how PrimaryCaps route to DigitCaps: the options of any routing algorithm
            (``model/routing=<name>``, :mod:`capsexp.nn.routers`); the paper's dynamic routing with 3
            iterations by default. The class scores are the class capsules' activations (their lengths
            under dynamic routing).
        reconstruction: build the decoder (the reconstruction regulariser of section 4.1).
        objects: objects per image (MultiMNIST: 2), each reconstructed from its own capsule; in
            evaluation, the ``objects`` longest capsules are decoded.
        conv_channels, primary_types, primary_dim, pose_dim: layer widths (paper: 256, 32, 8, 16).
    """

    def __init__(
        self,
        in_channels: PositiveInt = 1,
        image_size: PositiveInt = 28,
        num_classes: PositiveInt = 10,
        reconstruction: bool = True,
        objects: PositiveInt = 1,
        routing: RoutingOptions = DynamicRouting(),
        conv_channels: PositiveInt = 256,
        primary_types: PositiveInt = 32,
        primary_dim: PositiveInt = 8,
        pose_dim: PositiveInt = 16,
    ) -> None:
        super().__init__()
        self.image_shape = (in_channels, image_size, image_size)
        self.num_classes, self.pose_dim, self.objects = num_classes, pose_dim, objects
        self.conv1 = nn.Conv2d(in_channels, conv_channels, kernel_size=9)
        self.primary = PrimaryCapsules(conv_channels, primary_types, primary_dim, kernel_size=9, stride=2)
        feature_size = image_size - 8
        if feature_size < 9:
            raise ValueError(f"CapsNet: image_size={image_size} is too small for two 9x9 convolutions (needs >= 17)")
        num_primary = self.primary.output_size(feature_size, feature_size)
        self.digits = RoutingCapsules(num_primary, primary_dim, num_classes, pose_dim, routing)
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
        """Reconstruct images from class capsules (B, classes, pose_dim), keeping only ``classes``:
        (B,) gives (B, C, H, W); (B, T) gives T reconstructions per image, (B, T, C, H, W)."""
        if self.decoder is None:
            raise RuntimeError("this CapsNet was built with reconstruction=False: it has no decoder")
        if classes.ndim == 2:
            decoded = self.decode(poses.repeat_interleave(classes.shape[1], dim=0), classes.flatten())
            return decoded.view(*classes.shape, *self.image_shape)
        mask = F.one_hot(classes, self.num_classes).to(poses.dtype).unsqueeze(-1)
        return self.decoder((poses * mask).flatten(1)).view(-1, *self.image_shape)

    def forward(self, images: torch.Tensor, targets: torch.Tensor | None = None) -> CapsNetOutput:
        """``targets`` (B,) or (B, T) in training; None in evaluation (the longest capsules are decoded)."""
        check_images(images, self.image_shape, "CapsNet")
        # In place: conv1's backward needs its input, not its output; saves a 52 MB buffer at batch 128.
        primary = self.primary(F.relu(self.conv1(images), inplace=True))
        poses, scores, _ = self.digits(primary)  # (B, classes, pose_dim), (B, classes)
        reconstructions = None
        if self.decoder is not None:
            if targets is None:
                targets = scores.argmax(dim=-1) if self.objects == 1 else scores.topk(self.objects, dim=-1).indices
            reconstructions = self.decode(poses, targets)
        return CapsNetOutput(scores, poses, reconstructions)
