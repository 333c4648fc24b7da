"""Each model's forward against its wiring recomputed step by step on a tiny instance, from the layer
descriptions of its paper, with ``torch.nn.functional`` and plain loops on the model's own parameters:
a layer left out, a wrong stride, padding, activation, channel grouping or capsule order changes the
output. float64 throughout, so the comparison is tight."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from capsexp.models import BaselineCNN, CapsNet, LeNet5
from capsexp.nn import DynamicRouting
from tests.test_capsule_ops import paper_squash, procedure_1


def parameters(net: torch.nn.Module) -> list[torch.Tensor]:
    """The net's parameters in the order its layers were built."""
    return [p.detach() for p in net.parameters()]


def test_lenet5_is_conv_pool_conv_pool_then_three_fully_connected_layers():
    torch.manual_seed(0)
    for channels, size in ((1, 28), (2, 32)):
        net = LeNet5(in_channels=channels, num_classes=5, image_size=size).double().eval()
        images = torch.rand(3, channels, size, size, dtype=torch.float64)
        w1, b1, w2, b2, w3, b3, w4, b4, w5, b5 = parameters(net)
        # LeCun et al. 1998: C1 6@5x5 (here padded by 2: a 28x28 digit as the paper's 32x32 input), S2
        # 2x2 subsampling, C3 16@5x5, S4 2x2, then 120, 84 and the classes (ReLU and max-pooling here).
        assert w1.shape == (6, channels, 5, 5) and w2.shape == (16, 6, 5, 5)
        x = F.max_pool2d(F.relu(F.conv2d(images, w1, b1, padding=2)), 2)
        x = F.max_pool2d(F.relu(F.conv2d(x, w2, b2)), 2)
        assert x.shape[1:] == (16, (size // 2 - 4) // 2, (size // 2 - 4) // 2)
        x = F.relu(F.linear(x.flatten(1), w3, b3))
        x = F.relu(F.linear(x, w4, b4))
        expected = F.linear(x, w5, b5)
        assert w3.shape[0] == 120 and w4.shape[0] == 84 and expected.shape == (3, 5)
        torch.testing.assert_close(net(images), expected, rtol=0, atol=1e-12)


def test_baseline_cnn_is_size_preserving_convolutions_then_fully_connected_layers():
    torch.manual_seed(0)
    net = BaselineCNN(in_channels=2, num_classes=4, image_size=10, conv_layers=[3, 5], hidden_sizes=[7, 6])
    net = net.double().eval()  # dropout off
    images = torch.rand(3, 2, 10, 10, dtype=torch.float64)
    w1, b1, w2, b2, w3, b3, w4, b4, w5, b5 = parameters(net)
    # Sabour et al. 2017, section 5: 5x5 convolutions, stride 1 (padded to keep the size, no pooling),
    # ReLU; fully connected layers with ReLU; dropout; the class layer.
    x = F.relu(F.conv2d(images, w1, b1, padding=2))
    x = F.relu(F.conv2d(x, w2, b2, padding=2))
    assert x.shape == (3, 5, 10, 10)
    x = F.relu(F.linear(x.flatten(1), w3, b3))
    x = F.relu(F.linear(x, w4, b4))
    torch.testing.assert_close(net(images), F.linear(x, w5, b5), rtol=0, atol=1e-12)


def capsnet_by_hand(net: CapsNet, images: torch.Tensor, types: int, dim: int, iterations: int):
    """Sabour et al. 2017, section 4, with loops: ReLU conv1 (9x9, stride 1); PrimaryCaps, a 9x9 stride-2
    convolution whose channels are ``types`` types of ``dim``-D capsules (channel t * dim + d is
    dimension d of type t), one capsule per type and position, squashed (Eq. 1); u_hat_j|i = W_ij u_i;
    Procedure 1; the class capsules' lengths."""
    features = F.relu(F.conv2d(images, net.conv1.weight, net.conv1.bias))
    primary = F.conv2d(features, net.primary.conv.weight, net.primary.conv.bias, stride=2)
    batch, _, height, width = primary.shape
    capsules = []  # capsule i = (type t, row y, column x), type-major
    for t in range(types):
        for y in range(height):
            for x in range(width):
                capsules.append(
                    torch.stack(
                        [torch.stack([paper_squash(primary[n, t * dim : (t + 1) * dim, y, x])]) for n in range(batch)]
                    )[:, 0]
                )
    u = torch.stack(capsules, dim=1)  # (B, I, dim)
    children, parents, pose = net.digits.in_caps, net.digits.out_caps, net.digits.out_dim
    assert u.shape[1] == children
    # W_ij: (pose x dim) for each child i and parent j.
    w = net.digits.weight.view(children, dim, parents, pose).permute(0, 2, 3, 1)
    votes = torch.einsum("ijpd,bid->bijp", w, u)
    v, _ = procedure_1(votes, iterations)
    return v, v.norm(dim=-1)


def decoder_by_hand(net: CapsNet, poses: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Section 4.1: every class capsule but ``keep`` masked to 0, then FC 512 ReLU, 1024 ReLU, sigmoid."""
    mask = torch.zeros(poses.shape[:2], dtype=poses.dtype)
    mask[torch.arange(len(keep)), keep] = 1
    w1, b1, w2, b2, w3, b3 = (p.detach() for p in net.decoder.parameters())
    x = F.relu(F.linear((poses * mask[..., None]).flatten(1), w1, b1))
    x = F.relu(F.linear(x, w2, b2))
    return torch.sigmoid(F.linear(x, w3, b3)).view(len(keep), *net.image_shape)


def test_capsnet_is_conv1_primary_capsules_digit_capsules_routed_by_procedure_1_and_the_masked_decoder():
    torch.manual_seed(0)
    types, dim = 3, 4
    net = CapsNet(
        in_channels=1,
        image_size=20,  # conv1 -> 12x12, PrimaryCaps -> 2x2
        num_classes=5,
        conv_channels=6,
        primary_types=types,
        primary_dim=dim,
        pose_dim=3,
        routing=DynamicRouting(iterations=3),
    ).double()
    with torch.no_grad():  # votes that move the couplings
        net.primary.conv.weight.mul_(20)
        net.digits.weight.mul_(30)
    images = torch.rand(2, 1, 20, 20, dtype=torch.float64)
    with torch.no_grad():
        poses, lengths = capsnet_by_hand(net, images, types, dim, iterations=3)
        out = net.eval()(images)
        # squash's safeguard (1e-8 under its square root, not in Eq. 1) moves short capsules by ~1e-6.
        torch.testing.assert_close(out.poses, poses, rtol=1e-5, atol=1e-8)
        torch.testing.assert_close(out.scores, lengths, rtol=1e-5, atol=1e-8)
        # In evaluation the longest class capsule is decoded; in training the target's.
        expected = decoder_by_hand(net, poses, lengths.argmax(1))
        torch.testing.assert_close(out.reconstructions, expected, rtol=1e-5, atol=1e-8)
        targets = (lengths.argmax(1) + 1) % 5  # not the prediction: the two paths must differ
        trained = net.train()(images, targets)
        torch.testing.assert_close(trained.reconstructions, decoder_by_hand(net, poses, targets), rtol=1e-5, atol=1e-8)
        assert not torch.allclose(trained.reconstructions, out.reconstructions)
        # One routing iteration is uniform coupling: another output, so the iterations are applied.
        net.digits.routing = DynamicRouting(iterations=1)
        assert not torch.allclose(net.eval()(images).poses, poses, atol=1e-6)
