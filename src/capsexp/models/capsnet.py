"""CapsNet with dynamic routing (Sabour, Frosst & Hinton 2017, "Dynamic Routing Between Capsules").

conv1 256@9x9 ReLU -> PrimaryCaps 32x8D, 9x9 stride 2 -> DigitCaps (one 16D capsule per class, routing
between PrimaryCaps and DigitCaps only) -> class scores = capsule lengths. Decoder (Fig. 2): the
DigitCaps output with every capsule but one masked out -> FC 512 ReLU -> FC 1024 ReLU -> FC H*W*C
sigmoid. In training the kept capsule is the true class's, otherwise the longest. With several objects
per image (MultiMNIST, section 6) each is reconstructed from its own capsule: the true classes' in
training, otherwise the ``objects`` longest.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from pydantic import PositiveInt
from torch import nn

from capsexp.config.arguments import checked
from capsexp.models.input_check import check_images
from capsexp.nn import Backbone, DynamicRouting, PrimaryCapsules, ResNetStem, RoutingCapsules, RoutingOptions
from capsexp.nn.vector_capsules import INIT_STD as ROUTING_INIT_STD
from capsexp.nn.vector_capsules import Couplings

# What stands between PrimaryCaps and the decoder: the class capsules (routed) or the plain reference.
Head = Literal["capsules", "fully_connected"]
# The class scores: the class capsules' activations (capsule lengths under dynamic routing), or a logit
# per class from its pose by one linear map shared by the classes, w . v_j + b (inverted dot-product
# attention routing's classifier, Tsai et al. 2020), for a cross-entropy loss.
ClassScores = Literal["activations", "pose_logits"]
# The official code's initialisation (research/capsules, models/layers/variables.py): weights from a normal
# truncated at two standard deviations, of std 0.1 (conv1: 0.05); biases 0.1.
OFFICIAL_STD, OFFICIAL_CONV1_STD, OFFICIAL_BIAS = 0.1, 0.05, 0.1


def _truncated_normal_(weight: torch.Tensor, std: float) -> None:
    nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)


class FullyConnectedHead(nn.Module):
    """The non-capsule reference in DigitCaps' place, of matched size: the same children flattened
    (I x in_dim features), a ReLU layer of J x D units, and J logits. Its first layer has as many weights
    as DigitCaps' W_ij (I in_dim J D); the second adds J D J. The hidden units, read as D features per
    class, are what the decoder reconstructs from, as it reads the class capsules; the scores are
    sigmoid(logits), in (0, 1) like capsule lengths, so that the same margin loss applies."""

    score_kind = "sigmoid score"  # what its scores are called, as CapsNet's class scores

    def __init__(self, in_caps: int, in_dim: int, out_caps: int, out_dim: int) -> None:
        super().__init__()
        self.out_caps, self.out_dim = out_caps, out_dim
        self.hidden = nn.Linear(in_caps * in_dim, out_caps * out_dim)
        self.logits = nn.Linear(out_caps * out_dim, out_caps)

    def forward(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """inputs (B, I, in_dim) -> features (B, J, D), scores (B, J)."""
        features = F.relu(self.hidden(inputs.flatten(1)))
        return features.view(-1, self.out_caps, self.out_dim), torch.sigmoid(self.logits(features))


class CapsNetOutput(NamedTuple):
    # (B, classes): the class capsules' activations (dynamic routing: their lengths), or logits
    scores: torch.Tensor
    poses: torch.Tensor  # (B, classes, pose_dim): the class capsules (head=fully_connected: its features)
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
        backbone: ``conv`` (the paper's conv1, 9x9) or ``resnet`` (:class:`~capsexp.nn.ResNetStem`:
            3x3 convolutions and two residual blocks of ``conv_channels`` channels that keep the image's
            size, so that PrimaryCaps sees a larger grid).
        head: ``capsules`` (DigitCaps, routed) or ``fully_connected``, the plain-network reference of
            matched size (:class:`FullyConnectedHead`; ``routing`` is then unused).
        class_scores: ``activations`` (presence scores in [0, 1], for the margin loss) or
            ``pose_logits`` (w . v_j + b, for a cross-entropy loss: ``model/loss=cross_entropy``).
        reconstruction: build the decoder (the reconstruction regulariser of section 4.1).
        objects: objects per image (MultiMNIST: 2), each reconstructed from its own capsule; in
            evaluation, the ``objects`` longest capsules are decoded.
        conv_channels, primary_types, primary_dim, pose_dim: layer widths (paper: 256, 32, 8, 16).
        capsule_bias: None (the paper's parameter count: no capsule biases), or the value the official
            code's capsule biases start at (0.1): PrimaryCaps as the official layer
            (:class:`~capsexp.nn.PrimaryCapsules`'s ``bias``) and a learned bias added to DigitCaps' s_j
            in every routing iteration (:class:`~capsexp.nn.RoutingCapsules`'s ``bias``; dynamic routing only).
        official_init: initialise as the official code (``research/capsules``): conv1's kernel from a
            normal of std 0.05 truncated at two stds, its bias 0.1; PrimaryCaps' kernel, DigitCaps' W and the
            decoder's weights of std 0.1, truncated, biases 0.1. False: PyTorch's default layers and W_ij of
            std 0.01.
        shared_transform: one W per (PrimaryCaps type, class) shared by the type's positions, instead of
            one per primary capsule (:class:`~capsexp.nn.RoutingCapsules`'s ``child_types``; Gu & Tresp
            2020, whose AffCaps also average instead of routing: ``model/routing=uniform``).
        couplings: ``own``, or ``shuffled``: each image routed by the couplings its routing found for another
            image of the batch, the control for whether they depend on the image
            (:class:`~capsexp.nn.routers.ShuffledCouplings`).
    """

    def __init__(
        self,
        in_channels: PositiveInt = 1,
        image_size: PositiveInt = 28,
        num_classes: PositiveInt = 10,
        reconstruction: bool = True,
        objects: PositiveInt = 1,
        routing: RoutingOptions = DynamicRouting(),
        backbone: Backbone = "conv",
        head: Head = "capsules",
        class_scores: ClassScores = "activations",
        conv_channels: PositiveInt = 256,
        primary_types: PositiveInt = 32,
        primary_dim: PositiveInt = 8,
        pose_dim: PositiveInt = 16,
        capsule_bias: float | None = None,
        official_init: bool = False,
        shared_transform: bool = False,
        couplings: Couplings = "own",
    ) -> None:
        super().__init__()
        if capsule_bias is not None and not (head == "capsules" and isinstance(routing, DynamicRouting)):
            raise ValueError(
                f"capsule_bias={capsule_bias}: the official capsule biases are those of dynamic routing's "
                "DigitCaps (model/routing=dynamic, model.net.head=capsules)"
            )
        if couplings != "own" and head != "capsules":
            raise ValueError(
                f"couplings={couplings}: the couplings are DigitCaps'; model.net.head=fully_connected has none"
            )
        if shared_transform and head != "capsules":
            raise ValueError(
                "shared_transform=true: the shared W is DigitCaps'; model.net.head=fully_connected has none"
            )
        self.image_shape = (in_channels, image_size, image_size)
        self.num_classes, self.pose_dim, self.objects = num_classes, pose_dim, objects
        if backbone == "conv":
            self.conv1 = nn.Conv2d(in_channels, conv_channels, kernel_size=9)
            feature_size = image_size - 8
        else:
            self.conv1 = ResNetStem(in_channels, conv_channels)
            feature_size = image_size
        self.primary = PrimaryCapsules(
            conv_channels, primary_types, primary_dim, kernel_size=9, stride=2, bias=capsule_bias
        )
        if feature_size < 9:
            raise ValueError(f"CapsNet: image_size={image_size} is too small for two 9x9 convolutions (needs >= 17)")
        num_primary = self.primary.output_size(feature_size, feature_size)
        self.digits = (
            RoutingCapsules(
                num_primary,
                primary_dim,
                num_classes,
                pose_dim,
                routing,
                init_std=OFFICIAL_STD if official_init else ROUTING_INIT_STD,
                bias=capsule_bias,
                truncated_init=official_init,
                child_types=primary_types if shared_transform else None,
                couplings=couplings,
            )
            if head == "capsules"
            else FullyConnectedHead(num_primary, primary_dim, num_classes, pose_dim)
        )
        self.class_logit = nn.Linear(pose_dim, 1) if class_scores == "pose_logits" else None
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
        if official_init:
            with torch.no_grad():
                if isinstance(self.conv1, nn.Conv2d):
                    _truncated_normal_(self.conv1.weight, OFFICIAL_CONV1_STD)
                    self.conv1.bias.fill_(OFFICIAL_BIAS)
                _truncated_normal_(self.primary.conv.weight, OFFICIAL_STD)
                if self.primary.conv.bias is not None:
                    self.primary.conv.bias.fill_(OFFICIAL_BIAS)
                for layer in self.decoder or []:
                    if isinstance(layer, nn.Linear):
                        _truncated_normal_(layer.weight, OFFICIAL_STD)
                        layer.bias.fill_(OFFICIAL_BIAS)

    @property
    def score_kind(self) -> str:
        """What its class scores are called where they are presence scores: as its class capsules (their
        router) or its fully connected head declare."""
        return self.digits.score_kind

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
        features = self.conv1(images)
        if not isinstance(self.conv1, ResNetStem):  # the stem ends in its own ReLU
            # In place: conv1's backward needs its input, not its output; saves a 52 MB buffer at batch 128.
            features = F.relu(features, inplace=True)
        primary = self.primary(features)
        poses, scores, *_ = self.digits(primary)  # (B, classes, pose_dim), (B, classes)
        if self.class_logit is not None:
            scores = self.class_logit(poses).squeeze(-1)
        reconstructions = None
        if self.decoder is not None:
            if targets is None:
                targets = scores.argmax(dim=-1) if self.objects == 1 else scores.topk(self.objects, dim=-1).indices
            reconstructions = self.decode(poses, targets)
        return CapsNetOutput(scores, poses, reconstructions)
