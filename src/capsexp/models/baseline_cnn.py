"""The CNN baseline of the dynamic-routing paper (Sabour, Frosst & Hinton 2017, Sec. 5).

"A standard CNN with three convolutional layers of 256, 256, 128 channels. Each has 5x5 kernels and
stride of 1. The last convolutional layers are followed by two fully connected layers of size 328,
192. The last fully connected layer is connected with dropout to a 10 class softmax layer with cross
entropy loss." With zero padding that keeps the image size (no pooling is mentioned), this is
35,445,522 parameters on 28x28 MNIST: the paper's 35.4M. The paper gives no dropout rate; 0.5 is the
usual one. ReLU follows every layer but the last.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import torch
from annotated_types import Interval, MinLen
from pydantic import PositiveInt
from torch import nn

from capsexp.config.arguments import checked
from capsexp.models.input_check import check_images


@checked
class BaselineCNN(nn.Module):
    """The paper's baseline CNN, returning logits of shape (batch, num_classes).

    Args:
        in_channels: image channels (1 for MNIST, 2 for stereo smallNORB).
        num_classes: number of output classes.
        image_size: input height and width (an int for square images).
        conv_layers: output channels of each 5x5, stride-1, size-preserving convolution.
        hidden_sizes: widths of the fully connected layers after them.
        dropout: dropout probability before the output layer, in [0, 1).
    """

    def __init__(
        self,
        in_channels: PositiveInt = 1,
        num_classes: PositiveInt = 10,
        image_size: PositiveInt | tuple[PositiveInt, PositiveInt] = 28,
        conv_layers: Annotated[Sequence[PositiveInt], MinLen(1)] = (256, 256, 128),
        hidden_sizes: Annotated[Sequence[PositiveInt], MinLen(1)] = (328, 192),
        dropout: Annotated[float, Interval(ge=0, lt=1)] = 0.5,
    ) -> None:
        super().__init__()
        height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
        self.image_shape = (in_channels, height, width)
        layers: list[nn.Module] = []
        channels = in_channels
        for out_channels in conv_layers:
            layers += [nn.Conv2d(channels, int(out_channels), kernel_size=5, padding=2), nn.ReLU(inplace=True)]
            channels = int(out_channels)
        self.features = nn.Sequential(*layers)
        hidden: list[nn.Module] = [nn.Flatten()]
        width_in = channels * height * width  # size-preserving convolutions, no pooling
        for size in hidden_sizes:
            hidden += [nn.Linear(width_in, int(size)), nn.ReLU(inplace=True)]
            width_in = int(size)
        self.classifier = nn.Sequential(*hidden, nn.Dropout(dropout), nn.Linear(width_in, num_classes))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        check_images(images, self.image_shape, "BaselineCNN")
        return self.classifier(self.features(images))
