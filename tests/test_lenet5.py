"""LeNet5: the 1998 layout, flatten size derived from the input geometry."""

import pytest
import torch

from capsexp.models import LeNet5


def test_mnist_layout_and_parameter_count():
    net = LeNet5()
    assert net(torch.rand(4, 1, 28, 28)).shape == (4, 10)
    # conv1 156 + conv2 2,416 + fc 48,120 + 10,164 + 850: the classic 16x5x5 feature map.
    assert sum(p.numel() for p in net.parameters()) == 61_706
    assert net.classifier[1].in_features == 16 * 5 * 5


@pytest.mark.parametrize("channels,size,classes,features", [(2, 32, 5, 16 * 6 * 6), (1, 40, 10, 16 * 8 * 8)])
def test_other_geometries_derive_the_flatten_size(channels, size, classes, features):
    net = LeNet5(in_channels=channels, num_classes=classes, image_size=size)
    assert net.classifier[1].in_features == features
    assert net(torch.rand(2, channels, size, size)).shape == (2, classes)


def test_gradients_reach_the_first_layer():
    net = LeNet5()
    net(torch.rand(2, 1, 28, 28)).sum().backward()
    assert net.features[0].weight.grad.abs().sum() > 0
