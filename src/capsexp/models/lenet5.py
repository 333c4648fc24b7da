"""LeNet5 baseline (LeCun, Bottou, Bengio & Haffner 1998), adapted to small images.

The classic layout: conv 6@5x5 -> 2x2 max-pool -> conv 16@5x5 -> 2x2 max-pool -> fc 120 -> fc 84 ->
classes. The first convolution pads by 2 so that a 28x28 MNIST digit gives the paper's 32x32 geometry
(16x5x5 features before the classifier). ReLU and max-pooling replace the 1998 scaled tanh and
trainable subsampling, as every modern baseline does.
"""

from __future__ import annotations

import torch
from pydantic import PositiveInt
from torch import nn

from capsexp.config.arguments import checked
from capsexp.models.input_check import check_images


@checked
class LeNet5(nn.Module):
    """LeNet5 classifier returning logits of shape (batch, num_classes).

    Args:
        in_channels: image channels (1 for MNIST, 2 for stereo smallNORB).
        num_classes: number of output classes.
        image_size: input height and width, used only to derive the flatten size.
    """

    def __init__(
        self,
        in_channels: PositiveInt = 1,
        num_classes: PositiveInt = 10,
        image_size: PositiveInt | tuple[PositiveInt, PositiveInt] = 28,
    ) -> None:
        super().__init__()
        height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
        self.image_shape = (in_channels, height, width)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, kernel_size=5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, kernel_size=5),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        # Derive the flatten size from the geometry instead of hard-coding 16*5*5 (28x28 input):
        # smallNORB's 32x32 crops give 16*6*6.
        with torch.no_grad():
            num_features = self.features(torch.zeros(1, in_channels, height, width)).numel()
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(num_features, 120),
            nn.ReLU(inplace=True),
            nn.Linear(120, 84),
            nn.ReLU(inplace=True),
            nn.Linear(84, num_classes),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        check_images(images, self.image_shape, "LeNet5")
        return self.classifier(self.features(images))
