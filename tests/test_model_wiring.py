"""Each model's forward against its wiring recomputed step by step on a tiny instance, from the layer
descriptions of its paper, with ``torch.nn.functional`` and plain loops on the model's own parameters:
a layer left out, a wrong stride, padding, activation, channel grouping or capsule order changes the
output. float64 throughout, so the comparison is tight."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from capsexp.models import BaselineCNN, CapsNet, LeNet5, MatrixCapsNet
from capsexp.nn import EM_PAPER, DynamicRouting, EMRouting
from tests.em_reference import plain_em_routing, plain_options
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
    for image_size, (height, width) in ((10, (10, 10)), ((10, 7), (10, 7))):  # square, and (height, width)
        net = BaselineCNN(in_channels=2, num_classes=4, image_size=image_size, conv_layers=[3, 5], hidden_sizes=[7, 6])
        net = net.double().eval()  # dropout off
        images = torch.rand(3, 2, height, width, dtype=torch.float64)
        w1, b1, w2, b2, w3, b3, w4, b4, w5, b5 = parameters(net)
        # Sabour et al. 2017, section 5: 5x5 convolutions, stride 1 (padded to keep the size, no pooling),
        # ReLU; fully connected layers with ReLU; dropout; the class layer.
        x = F.relu(F.conv2d(images, w1, b1, padding=2))
        x = F.relu(F.conv2d(x, w2, b2, padding=2))
        assert x.shape == (3, 5, height, width)
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
        net.digits.router.routing = DynamicRouting(iterations=1)  # the options its router routes by
        assert not torch.allclose(net.eval()(images).poses, poses, atol=1e-6)


def em_route_by_hand(layer, votes, activations, routing: EMRouting, **children):
    """Procedure 1 as tests/em_reference.py transcribes it, with the layer's betas and, where it learns
    one, its factor on the inverse temperatures."""
    scale = layer.log_inverse_temperature.exp() if routing.learn_inverse_temperature else None
    return plain_em_routing(
        votes,
        activations,
        layer.beta_u,
        layer.beta_a,
        inverse_temperature_scale=scale,
        **children,
        **plain_options(routing),
    )


def conv_caps_by_hand(layer, poses, activations, stride: int, routing: EMRouting):
    """ConvCaps (section 4), with loops: the parent at output position (y, x) gets, from child type i at
    input position (y * stride + ky, x * stride + kx), the vote M_i W_(ky, kx, i, j); a child is shared by
    every window holding it (the paper) or, with route_per_window, each window's slots are children of
    their own. Poses (N, I, P, P, H, W) -> parents' poses (N, J, P, P, H', W'), activations (N, J, H', W')."""
    batch, types, pose, _, height, width = poses.shape
    k = layer.kernel_size
    out_height, out_width = (height - k) // stride + 1, (width - k) // stride + 1
    votes, child_ids = [], []  # per output position q = y * W' + x, its slots (ky, kx, i)
    for y in range(out_height):
        for x in range(out_width):
            slots, ids = [], []
            for ky in range(k):
                for kx in range(k):
                    for i in range(types):
                        row, column = y * stride + ky, x * stride + kx
                        matrix = poses[:, i, :, :, row, column]  # (N, P, P)
                        slots.append(matrix[:, None] @ layer.weight[ky * k + kx, i])  # (N, J, P, P)
                        ids.append(i * height * width + row * width + column)
            votes.append(torch.stack(slots, dim=1))
            child_ids.append(ids)
    votes = torch.stack(votes, dim=1).flatten(-2)  # (N, Q, M, J, P*P)
    child_index = torch.tensor(child_ids)
    child_activations = activations.reshape(batch, -1)  # child i * H * W + row * W + column
    if routing.route_per_window:
        child_activations = child_activations[:, child_index.reshape(-1)]
        child_index = torch.arange(child_index.numel()).view_as(child_index)
    mu, parent_activations = em_route_by_hand(
        layer, votes, child_activations, routing, child_index=child_index, num_children=child_activations.shape[1]
    )
    parents = mu.shape[2]
    mu = mu.view(batch, out_height, out_width, parents, pose, pose).permute(0, 3, 4, 5, 1, 2)
    return mu, parent_activations.view(batch, out_height, out_width, parents).permute(0, 3, 1, 2)


def em_caps_by_hand(net: MatrixCapsNet, images: torch.Tensor, routing: EMRouting, pose: int, centres: torch.Tensor):
    """Hinton et al. 2018, Fig. 1, with loops: conv1 5x5 stride 2, BatchNorm (evaluation: running
    statistics), ReLU; PrimaryCaps, 1x1 convolutions, pose channel t * P*P + e is element e (row-major)
    of type t's pose, a sigmoid activation per type; ConvCaps1 (stride 2), ConvCaps2 (stride 1); class
    capsules, one W per child type, the receptive-field centre ``centres[h, w]`` (row, column) added to
    the first two elements of the right-hand column of each vote (coordinate addition)."""
    bn = net.conv1_norm
    x = F.conv2d(images, net.conv1.weight, net.conv1.bias, stride=2)
    x = (x - bn.running_mean[:, None, None]) / torch.sqrt(bn.running_var[:, None, None] + bn.eps)
    x = F.relu(x * bn.weight[:, None, None] + bn.bias[:, None, None])
    batch, _, height, width = x.shape
    pose_maps = F.conv2d(x, net.primary.pose.weight, net.primary.pose.bias)
    types = pose_maps.shape[1] // pose**2
    poses = pose_maps.view(batch, types, pose, pose, height, width)
    activations = torch.sigmoid(F.conv2d(x, net.primary.activation.weight, net.primary.activation.bias))
    poses, activations = conv_caps_by_hand(net.conv_caps1, poses, activations, 2, routing)
    poses, activations = conv_caps_by_hand(net.conv_caps2, poses, activations, 1, routing)
    layer = net.class_caps
    types, height, width = poses.shape[1], poses.shape[-2], poses.shape[-1]
    votes = []  # children (h, w, i)
    for h in range(height):
        for w in range(width):
            for i in range(types):
                vote = poses[:, i, :, :, h, w][:, None] @ layer.weight[i]  # (N, J, P, P)
                offset = torch.zeros(pose, pose, dtype=vote.dtype)
                offset[0, -1], offset[1, -1] = centres[h, w, 0], centres[h, w, 1]
                votes.append(vote + offset)
    votes = torch.stack(votes, dim=1).flatten(-2)  # (N, children, J, P*P)
    mu, class_activations = em_route_by_hand(layer, votes, activations.permute(0, 2, 3, 1).flatten(1), routing)
    return mu, class_activations


@pytest.mark.parametrize("recipe", ["capsexp", "paper"])
def test_em_caps_is_conv1_primary_two_conv_capsule_layers_and_class_capsules_with_coordinate_addition(recipe):
    torch.manual_seed(0)
    routing = EMRouting() if recipe == "capsexp" else EM_PAPER
    assert routing.route_per_window == (recipe == "capsexp")  # both ways of sharing children are covered
    pose = 4
    net = MatrixCapsNet(
        in_channels=2,
        num_classes=3,
        image_size=24,  # conv1 -> 10x10, ConvCaps1 -> 4x4, ConvCaps2 -> 2x2
        conv_channels=5,
        primary_types=3,
        conv_caps1_types=2,
        conv_caps2_types=3,
        pose_size=pose,
        routing=routing,
    ).double()
    with torch.no_grad():  # no parameter at a value that hides a mix-up (betas, BatchNorm, temperatures)
        for name, parameter in net.named_parameters():
            if not name.endswith("weight") or "conv1_norm" in name:
                parameter.copy_(torch.randn_like(parameter) * 0.5)
        net.conv1_norm.running_mean.copy_(torch.randn(5) * 0.1)
        net.conv1_norm.running_var.copy_(torch.rand(5) + 0.5)
    # Receptive-field centres of ConvCaps2's 2x2 positions, by hand: conv1 output o is centred on pixel
    # 2o + 2, ConvCaps1 output c on conv1 output 2c + 1 (pixel 4c + 4), ConvCaps2 output d on ConvCaps1
    # output d + 1 (pixel 4d + 8); pixel p's centre is (p + 0.5) / 24.
    rows = (torch.tensor([8.0, 12.0], dtype=torch.float64) + 0.5) / 24
    centres = torch.stack(torch.meshgrid(rows, rows, indexing="ij"), dim=-1)
    images = torch.rand(2, 2, 24, 24, dtype=torch.float64)
    with torch.no_grad():
        poses, scores = em_caps_by_hand(net, images, routing, pose, centres)
        out = net.eval()(images)
    # The paper's variance floor (1e-4) makes the E-step sharp: summation-order rounding grows to ~1e-8.
    torch.testing.assert_close(out.scores, scores, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(out.poses, poses, rtol=1e-6, atol=1e-7)
    assert scores.std() > 1e-3 and poses.std() > 1e-3  # outputs that tell the wirings apart
    with torch.no_grad():  # transposed centres give another output, beyond the tolerance above
        assert not torch.allclose(em_caps_by_hand(net, images, routing, pose, centres.flip(-1))[0], poses, rtol=1e-5)
