"""CapsNet layers and model: the paper's layout, shapes, the decoder's input, learning."""

from __future__ import annotations

import functools

import lightning as L
import numpy as np
import pytest
import torch

from capsexp.data import MNISTDataModule
from capsexp.lit import CapsuleLoss, Classifier
from capsexp.models import CapsNet
from capsexp.nn import (
    DynamicRouting,
    PrimaryCapsules,
    RoutingCapsules,
    UniformRouting,
    dynamic_routing,
    fully_connected_routing,
)
from capsexp.nn.functional import squash


def test_primary_capsules_group_32_types_of_8_dims():
    layer = PrimaryCapsules(in_channels=1, num_types=32, dim=8, kernel_size=9, stride=2)
    with torch.no_grad():
        layer.conv.weight.zero_()
        layer.conv.bias.copy_(torch.arange(256.0) + 1)  # channel t * 8 + d carries t * 8 + d + 1
    capsules = layer(torch.zeros(2, 1, 20, 20))
    assert capsules.shape == (2, 32 * 6 * 6, 8) and layer.output_size(20, 20) == 1152
    for capsule_type in [0, 5, 31]:
        for position in [0, 17, 35]:
            vector = capsules[0, capsule_type * 36 + position]
            expected = torch.arange(8.0) + capsule_type * 8 + 1  # the 8 channels of that type
            assert torch.allclose(vector / vector.norm(), expected / expected.norm(), atol=1e-6)
    assert (capsules.norm(dim=-1) < 1).all()


def test_votes_are_w_ij_times_u_i():
    layer = RoutingCapsules(in_caps=5, in_dim=8, out_caps=3, out_dim=16)
    inputs = torch.randn(4, 5, 8)
    votes = layer.votes(inputs)
    assert votes.shape == (4, 5, 3, 16)
    weight = layer.weight.view(5, 8, 3, 16)
    for i in range(5):
        for j in range(3):
            assert torch.allclose(votes[:, i, j], inputs[:, i] @ weight[i, :, j], atol=1e-6)
    assert votes.transpose(1, 2).is_contiguous(), "votes should be stored parent-major for routing"


@pytest.mark.parametrize("routing", [DynamicRouting(), UniformRouting()])
def test_a_shared_transform_gives_every_position_of_a_type_its_types_w_and_sums_their_gradients(routing):
    """Gu & Tresp 2020: one W per (child type, parent). PrimaryCaps' children are type-major, so child i
    is of type i // positions; a child's vote is its type's W times it, wherever it sits."""
    torch.manual_seed(0)
    types, positions = 3, 4
    layer = RoutingCapsules(types * positions, 8, 5, 4, routing, child_types=types).double()
    assert layer.weight.shape == (types, 8, 5 * 4)
    inputs = torch.randn(2, types * positions, 8, dtype=torch.float64, requires_grad=True)
    votes = layer.votes(inputs)
    weight = layer.weight.view(types, 8, 5, 4)
    for i in range(types * positions):
        for j in range(5):
            torch.testing.assert_close(votes[:, i, j], inputs[:, i] @ weight[i // positions, :, j])
    # The gradient of the shared W is the sum of what each position's copy would get.
    upstream = torch.randn(2, 5, 4, dtype=torch.float64)
    (shared,) = torch.autograd.grad((layer(inputs).poses * upstream).sum(), layer.weight)
    unshared = RoutingCapsules(types * positions, 8, 5, 4, routing).double()
    with torch.no_grad():
        unshared.weight.copy_(layer.weight.repeat_interleave(positions, dim=0))
    (each,) = torch.autograd.grad((unshared(inputs).poses * upstream).sum(), unshared.weight)
    torch.testing.assert_close(shared, each.view(types, positions, 8, 20).sum(dim=1))
    with pytest.raises(ValueError, match="child_types=5 does not divide the 12 input capsules"):
        RoutingCapsules(12, 8, 5, 4, child_types=5)


def test_capsnet_with_a_shared_transform_has_one_w_per_primary_type_and_class():
    net = CapsNet(conv_channels=16, primary_types=4, shared_transform=True)
    assert net.digits.weight.shape == (4, 8, 10 * 16)
    assert (
        sum(p.numel() for p in net.parameters())
        == sum(p.numel() for p in CapsNet(conv_channels=16, primary_types=4).parameters()) - (4 * 36 - 4) * 8 * 160
    )
    with pytest.raises(ValueError, match="shared_transform=true"):
        CapsNet(shared_transform=True, head="fully_connected")


@pytest.mark.parametrize("detach_agreement", [False, True])
def test_fused_layer_equals_routing_its_votes(detach_agreement):
    """RoutingCapsules fuses the vote matmul with routing: same values and gradients as the two steps."""
    torch.manual_seed(0)
    layer = RoutingCapsules(7, 8, 5, 4, DynamicRouting(3, detach_agreement)).double()
    inputs = torch.randn(3, 7, 8, dtype=torch.float64, requires_grad=True)
    fused = layer(inputs).poses
    two_steps = dynamic_routing(layer.votes(inputs), DynamicRouting(3, detach_agreement))
    assert torch.allclose(fused, two_steps)
    upstream = torch.randn_like(fused)
    grads = torch.autograd.grad(fused, (inputs, layer.weight), upstream)
    reference = torch.autograd.grad(two_steps, (inputs, layer.weight), upstream)
    assert all(torch.allclose(a, b) for a, b in zip(grads, reference, strict=True))
    assert torch.autograd.gradcheck(
        lambda x, w: fully_connected_routing(x, w, 5, DynamicRouting(3, detach_agreement)), (inputs, layer.weight)
    )


def test_parameter_count_is_the_papers():
    assert sum(p.numel() for p in CapsNet().parameters()) == 8_215_568
    assert sum(p.numel() for p in CapsNet(reconstruction=False).parameters()) == 6_804_224


@pytest.mark.parametrize("channels,size,classes,primary", [(1, 28, 10, 1152), (2, 32, 5, 2048), (1, 40, 10, 4608)])
def test_output_shapes(channels, size, classes, primary):
    net = CapsNet(in_channels=channels, image_size=size, num_classes=classes)
    assert net.digits.in_caps == primary
    output = net(torch.rand(3, channels, size, size))
    assert output.scores.shape == (3, classes) and output.poses.shape == (3, classes, 16)
    assert output.reconstructions.shape == (3, channels, size, size)
    assert ((output.reconstructions >= 0) & (output.reconstructions <= 1)).all()


def test_bad_inputs_are_explained():
    with pytest.raises(ValueError, match=r"built for images of 1x28x28 .* got 1x32x32"):
        CapsNet()(torch.rand(2, 1, 32, 32))
    with pytest.raises(ValueError, match="too small"):
        CapsNet(image_size=16)
    with pytest.raises(RuntimeError, match="no decoder"):
        net = CapsNet(reconstruction=False)
        net.decode(torch.rand(1, 10, 16), torch.tensor([0]))


def test_decoder_gets_the_label_in_training_and_the_prediction_in_evaluation():
    torch.manual_seed(0)
    net = CapsNet()
    module = Classifier(net, CapsuleLoss(), functools.partial(torch.optim.Adam, lr=1e-3))
    images = torch.rand(4, 1, 28, 28)
    seen = {}

    def spy(output, images, targets):
        seen["output"] = output
        return CapsuleLoss()(output, images, targets)

    module.objective = spy
    module.log = lambda *args, **kwargs: None
    with torch.no_grad():
        predicted = net(images).scores.argmax(dim=-1)
        wrong = (predicted + 1) % 10
        module._step((images, wrong), "train")
        train_output = seen["output"]
        assert torch.allclose(train_output.reconstructions, net.decode(train_output.poses, wrong))
        module._step((images, wrong), "val")
        val_output = seen["output"]
        assert torch.allclose(val_output.reconstructions, net.decode(val_output.poses, predicted))


@pytest.mark.parametrize("blank", [False, True])
def test_gradients_reach_every_layer_without_nan(blank):
    net = CapsNet()
    images = torch.zeros(2, 1, 28, 28) if blank else torch.rand(2, 1, 28, 28)
    targets = torch.tensor([3, 7])
    CapsuleLoss()(net(images, targets), images, targets)["loss"].backward()
    for name, parameter in net.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name
        # (a blank image gives conv1's weights a zero gradient: it is proportional to the input)
        if not blank:
            assert parameter.grad.abs().sum() > 0, name


def test_capsule_loss_terms():
    net = CapsNet()
    images, targets = torch.rand(3, 1, 28, 28), torch.tensor([0, 1, 2])
    terms = CapsuleLoss(recon_weight=0.0005)(net(images, targets), images, targets)
    assert set(terms) == {"loss", "margin_loss", "recon_loss"}
    assert terms["loss"].item() == pytest.approx(
        terms["margin_loss"].item() + 0.0005 * terms["recon_loss"].item(), rel=1e-5
    )
    no_decoder = CapsNet(reconstruction=False)
    assert set(CapsuleLoss()(no_decoder(images), images, targets)) == {"loss", "margin_loss"}
    # A figure or a user asking it to reconstruct is told why it cannot, in the option's own spelling.
    with pytest.raises(RuntimeError, match=r"^this CapsNet was built with reconstruction=False: it has no decoder$"):
        no_decoder.decode(torch.zeros(1, 10, 16), torch.tensor([0]))


@pytest.mark.slow
def test_a_small_capsnet_learns_real_format_digits(mnist_dir, tmp_path):
    """A hundred steps on the synthetic IDX digits: the loss falls well below its start (to about 4% of
    it here) and the held-out digits are classified."""
    torch.manual_seed(0)
    net = CapsNet(conv_channels=32, primary_types=8)  # the paper's layout, narrower for a CPU test
    module = Classifier(net, CapsuleLoss(), functools.partial(torch.optim.Adam, lr=1e-3))
    datamodule = MNISTDataModule(
        mnist_dir, batch_size=16, val_size=60, verify_checksums=False, download=False, train_shift=2
    )
    losses = []

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            losses.append(outputs["loss"].item())

    trainer = L.Trainer(
        max_steps=100,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[Record()],
        default_root_dir=tmp_path,
    )
    trainer.fit(module, datamodule=datamodule)
    start, end = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert end < 0.3 * start, (start, end)
    assert trainer.callback_metrics["val/acc"] >= 0.9


def test_the_resnet_backbone_keeps_the_images_size_so_primarycaps_sees_a_larger_grid():
    conv = CapsNet(in_channels=3, image_size=32, conv_channels=16, primary_types=4)
    resnet = CapsNet(in_channels=3, image_size=32, conv_channels=16, primary_types=4, backbone="resnet")
    # PrimaryCaps' 9x9 stride-2 convolution: on 24x24 (after conv1's 9x9) an 8x8 grid, on 32x32 a 12x12 one.
    assert (conv.digits.in_caps, resnet.digits.in_caps) == (4 * 8 * 8, 4 * 12 * 12)
    features = resnet.conv1(torch.rand(2, 3, 32, 32))
    assert features.shape == (2, 16, 32, 32) and (features >= 0).all()
    out = resnet(torch.rand(2, 3, 32, 32))
    out.scores.sum().backward()
    assert all(p.grad is not None for p in resnet.conv1.parameters())


def official_update_routing(votes: np.ndarray, biases: np.ndarray, num_routing: int, leaky: bool) -> np.ndarray:
    """The official code's ``_update_routing`` for a fully connected layer (research/capsules,
    models/layers/layers.py), transcribed in numpy: votes [batch, input_dim, output_dim, atoms], biases
    [output_dim, atoms] added to every iteration's weighted sum before the squash."""
    logits = np.zeros(votes.shape[:3])
    for _ in range(num_routing):
        if leaky:  # a zero logit beside the output capsules takes its share, then is dropped
            padded = np.concatenate([np.zeros((*logits.shape[:2], 1)), logits], axis=2)
            route = (np.exp(padded) / np.exp(padded).sum(axis=2, keepdims=True))[:, :, 1:]
        else:
            route = np.exp(logits) / np.exp(logits).sum(axis=2, keepdims=True)
        preactivate = (route[..., None] * votes).sum(axis=1) + biases
        norm = np.linalg.norm(preactivate, axis=2, keepdims=True)
        activation = preactivate / norm * (norm**2 / (1 + norm**2))
        logits = logits + (votes * activation[:, None]).sum(axis=3)
    return activation


@pytest.mark.parametrize("leaky", [False, True])
def test_routing_with_the_official_bias_is_the_official_codes(leaky):
    """RoutingCapsules(bias=0.1) against the official layer transcribed: W std 0.1 (the official
    ``weight_variable``), biases 0.1, 3 iterations; float64."""
    torch.manual_seed(0)
    routing = DynamicRouting(iterations=3, none_of_the_above=leaky)
    layer = RoutingCapsules(12, 8, 10, 16, routing=routing, init_std=0.1, bias=0.1).double()
    with torch.no_grad():
        layer.router.bias.add_(0.05 * torch.randn_like(layer.router.bias))  # learned biases: not all equal
    inputs = squash(torch.randn(4, 12, 8, dtype=torch.float64))
    expected = official_update_routing(
        layer.votes(inputs).detach().numpy(), layer.router.bias.detach().numpy(), 3, leaky
    )
    # rtol: capsexp's squash keeps 1e-8 under its square root (SQUASH_EPS), the official code none.
    np.testing.assert_allclose(layer(inputs).poses.detach().numpy(), expected, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("detach_agreement", [False, True])
def test_the_bias_gradient_is_autograds(detach_agreement):
    """The written-out backward pass with a bias: votes, inputs, W and the bias get autograd's gradients
    of the same routing run step by step (float64)."""
    from capsexp.nn.functional._dynamic_routing import _route

    torch.manual_seed(0)
    routing = DynamicRouting(iterations=3, detach_agreement=detach_agreement)
    inputs = squash(torch.randn(3, 6, 4, dtype=torch.float64)).requires_grad_()
    weight = (0.3 * torch.randn(6, 4, 5 * 2, dtype=torch.float64)).requires_grad_()
    bias = (0.1 + 0.05 * torch.randn(5, 2, dtype=torch.float64)).requires_grad_()
    upstream = torch.randn(3, 5, 2, dtype=torch.float64)
    fused = torch.autograd.grad(
        (fully_connected_routing(inputs, weight, 5, routing, bias) * upstream).sum(), [inputs, weight, bias]
    )

    votes = torch.einsum("bid,idk->bik", inputs, weight).view(3, 6, 5, 2).transpose(1, 2)  # (B, J, I, D)
    if detach_agreement:  # the couplings as constants: only the last weighted sum carries gradient
        couplings, _, _ = _route(votes.detach(), routing, bias.detach())
        parents = squash(torch.matmul(couplings[-1].unsqueeze(2), votes).squeeze(2) + bias)
    else:
        parents = _route(votes, routing, bias)[2][-1]
    reference = torch.autograd.grad((parents * upstream).sum(), [inputs, weight, bias])
    for got, expected in zip(fused, reference, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12)


def test_a_layer_traces_its_routing_with_its_own_options_at_any_number_of_iterations():
    """What the routing figures and the convergence study trace: the layer's scale, none-of-the-above
    and capsule biases kept, only the iterations changed."""
    from capsexp.nn.functional import dynamic_routing_trace

    torch.manual_seed(2)
    routing = DynamicRouting(3, logit_scale=20.0, none_of_the_above=True)
    layer = RoutingCapsules(7, 8, 5, 4, routing, bias=0.1).double()
    children = squash(torch.randn(2, 7, 8, dtype=torch.float64))
    traced = layer.dynamic_routing_trace(children, iterations=6)
    expected = dynamic_routing_trace(
        layer.votes(children), DynamicRouting(6, logit_scale=20.0, none_of_the_above=True), layer.router.bias
    )
    assert traced.couplings.shape[0] == 6 and torch.equal(traced.couplings, expected.couplings)
    plain = dynamic_routing_trace(layer.votes(children), DynamicRouting(6))  # what was traced before
    assert not torch.allclose(plain.couplings[-1], traced.couplings[-1], atol=1e-3)
    assert torch.equal(
        layer.dynamic_routing_trace(children).couplings,
        dynamic_routing_trace(layer.votes(children), routing, layer.router.bias).couplings,
    )


def test_primary_capsules_with_the_official_bias_are_the_official_layers():
    """PrimaryCapsules(bias=...) against the official ``conv_slim_capsule`` (one input capsule, one routing
    iteration) transcribed: the convolution's outputs are the votes of each position's single child for the
    capsule types, routed once (couplings 1/num_types), a learned bias per type and dimension added, then
    squashed. Biases not all equal; float64."""
    torch.manual_seed(0)
    types, dim = 3, 4
    layer = PrimaryCapsules(in_channels=5, num_types=types, dim=dim, kernel_size=3, stride=2, bias=0.1).double()
    with torch.no_grad():
        layer.bias.add_(0.05 * torch.randn_like(layer.bias))
    features = torch.randn(2, 5, 9, 9, dtype=torch.float64)
    conv = torch.nn.functional.conv2d(features, layer.conv.weight.detach(), stride=2)  # (B, types * dim, H, W)
    batch, _, height, width = conv.shape
    votes = conv.reshape(batch, types, dim, height, width).permute(0, 3, 4, 1, 2).reshape(-1, 1, types, dim)
    biases = layer.bias.detach().reshape(types, dim).numpy()
    expected = official_update_routing(votes.numpy(), biases, num_routing=1, leaky=False)
    expected = expected.reshape(batch, height, width, types, dim).transpose(0, 3, 1, 2, 4).reshape(batch, -1, dim)
    np.testing.assert_allclose(layer(features).detach().numpy(), expected, rtol=1e-6, atol=1e-12)
