"""The dynamic-routing paper's CNN baseline: its size, other geometries, bad options, and that it learns."""

import pytest
import torch

from capsexp.models import BaselineCNN


def test_mnist_parameter_count_is_the_papers():
    """Sabour et al. (2017), Sec. 5: 35.4M parameters on MNIST."""
    net = BaselineCNN()
    # conv 6,656 + 1,638,656 + 819,328; fc 128*28*28*328 + 328 = 32,915,784; 63,168; 1,930
    assert sum(p.numel() for p in net.parameters()) == 35_445_522
    assert [m.out_channels for m in net.features if isinstance(m, torch.nn.Conv2d)] == [256, 256, 128]
    assert [m.out_features for m in net.classifier if isinstance(m, torch.nn.Linear)] == [328, 192, 10]


@pytest.mark.parametrize("channels,size,classes", [(2, 32, 5), (1, 40, 10), (1, 36, 10)])
def test_other_geometries(channels, size, classes):
    net = BaselineCNN(in_channels=channels, num_classes=classes, image_size=size, conv_layers=[4, 3], hidden_sizes=[5])
    assert net(torch.rand(2, channels, size, size)).shape == (2, classes)
    assert net.classifier[1].in_features == 3 * size * size  # the convolutions keep the image size


def test_dropout_acts_in_training_only():
    net = BaselineCNN(conv_layers=[2], hidden_sizes=[64], dropout=0.5)
    images = torch.rand(3, 1, 28, 28)
    net.eval()
    assert torch.equal(net(images), net(images))
    net.train()
    assert not torch.equal(net(images), net(images))


@pytest.mark.parametrize(
    "options,message",
    [
        ({"dropout": 1.0}, "BaselineCNN: dropout=1.0: must be less than 1"),
        ({"conv_layers": []}, "BaselineCNN: conv_layers=[]: must have at least 1 item, not 0"),
        ({"hidden_sizes": [8, 0]}, "BaselineCNN: hidden_sizes=[8,0]: must be greater than 0 (item 1)"),
        ({"dropout": 1.0, "in_channels": 0}, "BaselineCNN: in_channels=0: must be greater than 0; dropout=1.0: must"),
    ],
)
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError) as error:
        BaselineCNN(**options)
    assert str(error.value).startswith(message)


def test_a_small_one_learns_a_few_images():
    torch.manual_seed(0)
    net = BaselineCNN(conv_layers=[8, 8, 4], hidden_sizes=[32, 16], dropout=0.0)
    images, targets = torch.rand(16, 1, 28, 28), torch.arange(16) % 10
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    losses = []
    for _ in range(100):
        loss = torch.nn.functional.cross_entropy(net(images), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0]
    assert (net(images).argmax(1) == targets).all()
