"""A small ResNet stem: the convolutional front end self-routing (Hahn et al. 2019) and inverted
dot-product attention routing (Tsai et al. 2020) put before their capsules on colour images, here at a
size that keeps the image's resolution (3x3 convolutions, padding 1, stride 1)."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

# What makes the features a capsule model's first capsules read: the paper's own convolution, or a
# ResNetStem at the image's resolution, as the later routing papers use on colour images.
Backbone = Literal["conv", "resnet"]


class BasicBlock(nn.Module):
    """He et al. 2016's basic residual block: x + BN(conv3x3(ReLU(BN(conv3x3(x))))), then ReLU."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1, bias=False)
        self.norm1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, kernel_size=3, padding=1, bias=False)
        self.norm2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = self.norm2(self.conv2(F.relu(self.norm1(self.conv1(x)))))
        return F.relu(x + residual)


class ResNetStem(nn.Sequential):
    """conv3x3 (``in_channels`` -> ``channels``), BatchNorm, ReLU, then ``blocks`` basic residual blocks;
    the output has ``channels`` channels at the input's height and width, after a ReLU."""

    def __init__(self, in_channels: int, channels: int, blocks: int = 2) -> None:
        super().__init__(
            nn.Conv2d(in_channels, channels, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(inplace=True),
            *(BasicBlock(channels) for _ in range(blocks)),
        )
