"""EM routing, matrix-capsule layers, spread loss and margin schedules (Hinton et al. 2018)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import io
import math
import re
import warnings

import lightning as L
import numpy as np
import pytest
import torch
from PIL import Image

from capsexp.data import MNISTDataModule
from capsexp.lit import Classifier, SpreadLoss
from capsexp.lit.margin import LinearMargin, SigmoidMargin
from capsexp.models import LeNet5, MatrixCapsNet
from capsexp.nn import EM_PAPER, ClassMatrixCapsules, ConvMatrixCapsules, EMRouting, PrimaryMatrixCapsules
from capsexp.nn.functional import (
    COST_NORMALIZATIONS,
    em_routing,
    inverse_temperatures,
    responsibility_entropy,
    spread_loss,
)
from capsexp.nn.functional._em_routing import variance_floor
from capsexp.nn.functional._gaussian_votes import _Workspace
from capsexp.nn.matrix_capsules import conv_votes
from capsexp.records.events import load_events
from tests.em_reference import fast_em_routing, plain_em_routing, plain_options
from tests.helpers import TINY_EM_CAPS, TINY_RUN, run_cli_in_process
from tests.test_recipes import EM_ROUTING_PAPER


def routed(votes, activations, parents, **kwargs):
    return fast_em_routing(
        votes, activations, torch.zeros(parents), torch.zeros(parents), return_responsibilities=True, **kwargs
    )


def test_inverse_temperature_schedule():
    assert inverse_temperatures(EM_PAPER) == pytest.approx(
        [0.01 * (1 - 0.95), 0.01 * (1 - 0.95**2), 0.01 * (1 - 0.95**3)]
    )


@pytest.mark.parametrize(("detach_responsibilities", "e_step_temperature"), [(False, 1.0), (True, 1.0), (False, 4.0)])
@pytest.mark.parametrize("convolutional", [False, True])
@pytest.mark.parametrize("cost_normalization", COST_NORMALIZATIONS)
def test_matches_the_plain_transcription_values_and_gradients(
    convolutional, cost_normalization, detach_responsibilities, e_step_temperature
):
    """The optimised em_routing (expanded Gaussian, matrix-vector products) against the plain one."""
    torch.manual_seed(1)
    if convolutional:
        child_index = ConvMatrixCapsules(3, 4, kernel_size=2, stride=1).child_index(3, 3, torch.device("cpu"))
        votes = torch.randn(2, *child_index.shape, 4, 16, dtype=torch.float64)
        activations = torch.rand(2, 27, dtype=torch.float64)
    else:
        child_index, votes, activations = None, torch.randn(2, 12, 4, 16, dtype=torch.float64), torch.rand(2, 12)
    votes.requires_grad_()
    beta_u = torch.randn(4, dtype=torch.float64, requires_grad=True)
    beta_a = torch.randn(4, dtype=torch.float64, requires_grad=True)
    scale = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)  # a learned inverse temperature
    options = dict(
        iterations=3,
        final_lambda=1.0,
        child_index=child_index,
        cost_normalization=cost_normalization,
        return_responsibilities=True,
        inverse_temperature_scale=scale,
        detach_responsibilities=detach_responsibilities,
        e_step_temperature=e_step_temperature,
    )
    fast = fast_em_routing(votes, activations.double(), beta_u, beta_a, **options)
    plain = plain_em_routing(votes, activations.double(), beta_u, beta_a, **options)
    for a, b in zip(fast, plain, strict=True):
        assert torch.allclose(a, b, rtol=1e-7, atol=1e-9)
    upstream = [torch.randn_like(fast[0]), torch.randn_like(fast[1])]
    grads = torch.autograd.grad(fast[:2], (votes, beta_u, beta_a, scale), upstream)
    reference = torch.autograd.grad(plain[:2], (votes, beta_u, beta_a, scale), upstream)
    for a, b in zip(grads, reference, strict=True):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-8 * float(b.abs().max()))


@pytest.mark.parametrize("convolutional", [False, True])
def test_an_entropy_loss_on_the_responsibilities_moves_the_votes_as_the_plain_transcription_does(convolutional):
    """A loss on the responsibilities R returned (an entropy penalty, alone and beside one on the poses)
    gives the votes, the betas and the inverse temperature the plain transcription's gradient; with
    detach_responsibilities=true a loss on R alone is refused by autograd, not answered with zeros."""
    torch.manual_seed(2)
    if convolutional:
        child_index = ConvMatrixCapsules(3, 4, kernel_size=2, stride=1).child_index(3, 3, torch.device("cpu"))
        votes = torch.randn(2, *child_index.shape, 4, 16, dtype=torch.float64)
        activations = torch.rand(2, 27, dtype=torch.float64)
    else:
        child_index, votes, activations = None, torch.randn(2, 12, 4, 16, dtype=torch.float64), torch.rand(2, 12)
    leaves = (
        votes.requires_grad_(),
        torch.randn(4, dtype=torch.float64, requires_grad=True),
        torch.randn(4, dtype=torch.float64, requires_grad=True),
        torch.tensor(1.5, dtype=torch.float64, requires_grad=True),
    )
    options = dict(iterations=3, final_lambda=1.0, child_index=child_index, return_responsibilities=True)
    options["inverse_temperature_scale"] = leaves[3]

    def entropy(r):
        return -(r * r.clamp_min(1e-300).log()).sum()

    fast = fast_em_routing(leaves[0], activations.double(), *leaves[1:3], **options)
    plain = plain_em_routing(leaves[0], activations.double(), *leaves[1:3], **options)
    upstream = torch.randn_like(fast[0])
    for loss_of in (lambda out: entropy(out[2]), lambda out: entropy(out[2]) + (out[0] * upstream).sum()):
        got = torch.autograd.grad(loss_of(fast), leaves, retain_graph=True)
        want = torch.autograd.grad(loss_of(plain), leaves, retain_graph=True)
        assert got[0].abs().amax() > 1e-3
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8 * float(b.abs().max()))
    detached = fast_em_routing(leaves[0], activations.double(), *leaves[1:3], **options, detach_responsibilities=True)
    with pytest.raises(RuntimeError, match="does not require grad"):
        torch.autograd.grad(entropy(detached[2]), leaves)


def recipe_routing(model: str) -> EMRouting:
    """The routing options a model config builds (read from the config, not restated)."""
    from hydra.utils import instantiate

    from tests.helpers import compose_config

    return instantiate(compose_config([f"model={model}"]).model.net.routing)

    routing = compose_config([f"model={model}"]).model.net.routing
    return dict(
        iterations=routing.iterations,
        final_lambda=routing.final_lambda,
        sigma_eps=variance_floor(routing),
        cost_normalization=routing.cost_normalization,
        e_step_temperature=routing.e_step_temperature,
    )


@pytest.mark.parametrize("model", ["em_caps", "em_caps_paper"])
@pytest.mark.parametrize("spread", [0.01, 0.03])
@pytest.mark.parametrize("convolutional", [False, True])
@pytest.mark.parametrize("inactive_far", [False, True])
def test_float32_matches_float64_for_votes_far_from_zero(model, spread, convolutional, inactive_far):
    """Votes offset 20 with a small spread: an expanded Gaussian cancels in float32 (activations off by
    0.1, vote gradients by 100% before centring); float32 must stay within 1e-3 of float64. Also when
    most children are nearly inactive and vote 20 away from the active ones, where only a centre
    weighted by the activations sits near the parents' means."""
    generator = torch.Generator().manual_seed(0)
    if convolutional:
        child_index = ConvMatrixCapsules(6, 8, kernel_size=2, stride=1).child_index(3, 3, torch.device("cpu"))
        shape, children = (2, *child_index.shape, 8, 16), 54
    else:
        child_index, shape, children = None, (2, 50, 8, 16), 50
    votes = 20 + spread * torch.randn(shape, generator=generator, dtype=torch.float64)
    activations = torch.rand(2, children, generator=generator, dtype=torch.float64)
    if inactive_far:
        inactive = torch.arange(children) >= children // 5
        activations[:, inactive] = 5e-4
        slot_inactive = inactive[child_index] if convolutional else inactive
        votes[:, slot_inactive] -= 20
    beta_u, beta_a = torch.randn(2, 8, generator=generator, dtype=torch.float64)
    routing = recipe_routing(model)
    upstream = None
    results = {}
    for dtype in (torch.float64, torch.float32):
        leaf = votes.to(dtype).requires_grad_()
        mu, parent_activations = em_routing(
            leaf, activations.to(dtype), beta_u.to(dtype), beta_a.to(dtype), routing, child_index=child_index
        )
        if upstream is None:
            upstream = (torch.randn_like(mu), torch.randn_like(parent_activations))
        (grad,) = torch.autograd.grad((mu, parent_activations), leaf, [u.to(dtype) for u in upstream])
        results[dtype] = [t.detach().double() for t in (mu, parent_activations, grad)]
    (mu64, a64, grad64), (mu32, a32, grad32) = results[torch.float64], results[torch.float32]
    assert (a32 - a64).abs().max() < 1e-3
    if not (inactive_far and model == "em_caps_paper"):
        # Under the paper's options (sigma_eps 1e-4, three iterations) a parent whose data moves to
        # the inactive children in a later iteration has its mu far from the centre: there the
        # poses and vote gradients keep float32 errors of up to 0.2 (measured), activations do not,
        # and even float64 parts from the plain transcription by more than 1e-4.
        assert (mu32 - mu64).abs().max() < 1e-3
        assert (grad32 - grad64).norm() / grad64.norm() < 1e-3
        # float64 itself agrees with the plain transcription (every (V - mu)^2 materialised).
        plain_mu, plain_a = plain_em_routing(
            votes, activations, beta_u, beta_a, child_index=child_index, **plain_options(routing)
        )
        assert torch.allclose(mu64, plain_mu, atol=1e-9) and torch.allclose(a64, plain_a, atol=1e-9)


def test_translating_the_votes_of_a_parent_moves_its_pose_only():
    """Routing is translation-equivariant: shifting every vote for parent j by d shifts mu_j by d and
    leaves activations and responsibilities as they were (in float32, at a shift of 1000)."""
    torch.manual_seed(0)
    votes, activations = torch.randn(2, 30, 5, 16), torch.rand(2, 30)
    shift = 1000 * torch.randn(5, 16)
    mu, parent_activations, responsibilities = routed(votes, activations, 5, iterations=3, sigma_eps=1e-3)
    mu_shifted, activations_shifted, responsibilities_shifted = routed(
        votes + shift, activations, 5, iterations=3, sigma_eps=1e-3
    )
    assert torch.allclose(mu_shifted - shift, mu, atol=1e-3)
    assert torch.allclose(activations_shifted, parent_activations, atol=1e-5)
    assert torch.allclose(responsibilities_shifted, responsibilities, atol=1e-3)  # inputs at 1000 hold 6e-5


def test_inverse_temperature_scale_multiplies_every_lambda():
    """A scale s on the inverse temperatures is the schedule of final_lambda * s."""
    torch.manual_seed(0)
    votes, activations, beta = torch.randn(2, 20, 5, 16), torch.rand(2, 20), torch.randn(5)
    scaled = fast_em_routing(
        votes, activations, beta, beta, final_lambda=2.0, inverse_temperature_scale=torch.tensor(3.0)
    )
    plain = fast_em_routing(votes, activations, beta, beta, final_lambda=6.0)
    for a, b in zip(scaled, plain, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_learned_inverse_temperature_gets_a_gradient_in_every_layer():
    net = MatrixCapsNet(conv_channels=8, primary_types=4, conv_caps1_types=4, conv_caps2_types=4)
    assert EMRouting().learn_inverse_temperature  # capsexp's recipe
    layers = (net.conv_caps1, net.conv_caps2, net.class_caps)
    assert all(layer.log_inverse_temperature.item() == 0 for layer in layers)  # starts at the schedule
    spread_loss(net(torch.rand(4, 1, 28, 28)).scores, torch.tensor([0, 1, 2, 3]), 0.5).backward()
    assert all(layer.log_inverse_temperature.grad.abs() > 0 for layer in layers)
    fixed = EMRouting(learn_inverse_temperature=False)
    tiny = dict(conv_channels=8, primary_types=4, conv_caps1_types=4, conv_caps2_types=4)
    assert MatrixCapsNet(**tiny, routing=fixed).class_caps.log_inverse_temperature is None


def test_detached_responsibilities_change_the_gradients_of_a_net_not_its_scores():
    """routing.detach_responsibilities reaches every layer: the same forward pass, a gradient that
    no longer flows through the E-steps."""

    def scores_and_gradient(detach: bool):
        torch.manual_seed(0)
        routing = EMRouting(detach_responsibilities=detach)
        net = MatrixCapsNet(conv_channels=8, primary_types=4, conv_caps1_types=4, conv_caps2_types=4, routing=routing)
        scores = net(torch.rand(3, 1, 28, 28)).scores
        spread_loss(scores, torch.tensor([0, 1, 2]), 0.5).backward()
        return scores.detach(), net.primary.pose.weight.grad

    scores, gradient = scores_and_gradient(False)
    detached_scores, detached_gradient = scores_and_gradient(True)
    torch.testing.assert_close(detached_scores, scores)
    assert torch.isfinite(detached_gradient).all() and not torch.allclose(detached_gradient, gradient)


def test_routing_in_chunks_of_the_batch_gives_what_one_chunk_gives(monkeypatch):
    """A batch routed chunk by chunk (a small CHUNK_BYTES: chunks of 2, 2 and 1 items) gives the scores
    and gradients, of the parameters and of the images, that routing it whole gives, in float64; and
    so do votes given as a tensor, for the votes and the activations."""
    import capsexp.nn.functional._gaussian_votes as em

    def net_results():
        torch.manual_seed(0)
        net = MatrixCapsNet(conv_channels=8, primary_types=4, conv_caps1_types=4, conv_caps2_types=4).double()
        images = torch.rand(5, 1, 28, 28, dtype=torch.float64, requires_grad=True)
        scores = net(images).scores
        spread_loss(scores, torch.tensor([0, 1, 2, 3, 4]), 0.5).backward()
        return [scores.detach(), images.grad, *(p.grad for p in net.parameters())]

    layer = ConvMatrixCapsules(3, 4, kernel_size=2, stride=1)
    child_index = layer.child_index(3, 3, torch.device("cpu"))

    def votes_results():
        torch.manual_seed(0)
        votes = torch.randn(5, 4, 12, 4, 16, dtype=torch.float64, requires_grad=True)
        activations = torch.rand(5, 27, dtype=torch.float64, requires_grad=True)
        beta = torch.zeros(4, dtype=torch.float64)
        mu, parent_activations = em_routing(votes, activations, beta, beta, EMRouting(), child_index=child_index)
        (mu.sum() + (parent_activations * torch.arange(4)).sum()).backward()
        return [mu.detach(), parent_activations.detach(), votes.grad, activations.grad]

    whole = net_results(), votes_results()
    # 2.5 items' [V' | V'^2] in float64: of ConvCaps1 (Q=6x6 positions, J=4, M=3x3x4), of the votes.
    monkeypatch.setattr(em, "CHUNK_BYTES", int(2.5 * 2 * 36 * 4 * 36 * 16 * 8))
    assert [hi - lo for lo, hi in em._chunks(5, (36, 4, 36, 16), torch.float64)] == [2, 2, 1]
    chunked_net = net_results()
    monkeypatch.setattr(em, "CHUNK_BYTES", int(2.5 * 2 * 4 * 4 * 12 * 16 * 8))
    assert [hi - lo for lo, hi in em._chunks(5, (4, 4, 12, 16), torch.float64)] == [2, 2, 1]
    chunked = chunked_net, votes_results()
    for results, expected in zip(chunked, whole, strict=True):
        for got, want in zip(results, expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def _vote_gradient_inputs():
    """Factor pairs of a replay (3 products) and votes laid out as a ConvCaps layer makes them."""
    import capsexp.nn.functional._gaussian_routing as em

    torch.manual_seed(0)
    matrices, block = torch.randn(2, 18, 4, 16, dtype=torch.float64), torch.randn(18, 16, 5 * 16, dtype=torch.float64)
    votes = conv_votes(matrices, block)  # (2, 4, 5, 18, 16), strided
    votes_and_squares = torch.randn(2, 4, 5, 18, 32, dtype=torch.float64)
    over_m = [torch.randn(2, 4, 5, 18, dtype=torch.float64) for _ in range(3)]
    over_h = [torch.randn(2, 4, 5, 32, dtype=torch.float64) for _ in range(3)]
    return em, votes, votes_and_squares, over_m, over_h


@pytest.mark.slow
def test_fused_vote_gradient_is_the_matmul_form_in_the_votes_layout(monkeypatch):
    """The compiled one-pass vote gradient that large chunks take equals the two-matmul form, and both
    come back laid out as the votes are (so the vote GEMM's backward pass copies nothing)."""
    em, votes, votes_and_squares, over_m, over_h = _vote_gradient_inputs()
    results = {}
    for name, threshold in (("matmul", 2**62), ("fused", 0)):
        monkeypatch.setattr(em, "FUSED_MIN_ELEMENTS", threshold)
        grad = em._vote_gradient(votes_and_squares, over_m, over_h, _Workspace(votes), votes)
        assert grad.stride() == votes.stride()
        results[name] = grad.clone()
    centred = votes_and_squares[..., :16]
    factors = sum(m.unsqueeze(-1) * h.unsqueeze(-2) for m, h in zip(over_m, over_h, strict=True))
    torch.testing.assert_close(results["matmul"], factors[..., :16] + 2 * centred * factors[..., 16:])
    torch.testing.assert_close(results["fused"], results["matmul"], rtol=1e-12, atol=1e-12)


def test_a_vote_gradient_that_cannot_be_compiled_warns_and_is_computed_eagerly(monkeypatch):
    em, votes, votes_and_squares, over_m, over_h = _vote_gradient_inputs()

    def no_compiler(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(torch, "compile", no_compiler)
    monkeypatch.setattr(em, "_FUSED_VOTE_GRADIENT", em._Compiled(em._vote_gradient_fused))
    monkeypatch.setattr(em, "FUSED_MIN_ELEMENTS", 0)
    with pytest.warns(RuntimeWarning, match="no C.. compiler found.*eager form"):
        fused = em._vote_gradient(votes_and_squares, over_m, over_h, _Workspace(votes), votes).clone()
    assert not em._FUSED_VOTE_GRADIENT.usable
    monkeypatch.setattr(em, "FUSED_MIN_ELEMENTS", 2**62)
    matmul = em._vote_gradient(votes_and_squares, over_m, over_h, _Workspace(votes), votes)
    torch.testing.assert_close(fused, matmul)


def test_dense_responsibilities_sum_to_one_and_activations_in_unit_interval():
    torch.manual_seed(0)
    mu, activations, responsibilities = routed(torch.randn(3, 20, 5, 16), torch.rand(3, 20), 5, iterations=3)
    assert mu.shape == (3, 5, 16) and activations.shape == (3, 5)
    assert torch.allclose(responsibilities.sum(dim=-1), torch.ones(3, 20), atol=1e-5)
    assert ((activations > 0) & (activations < 1)).all()


def test_num_children_defaults_to_the_largest_child_index_plus_one():
    child_index = ConvMatrixCapsules(2, 3, kernel_size=2, stride=1).child_index(3, 3, torch.device("cpu"))
    torch.manual_seed(0)
    votes, activations = torch.randn(2, *child_index.shape, 3, 16), torch.rand(2, 18)
    given = em_routing(votes, activations, torch.zeros(3), torch.zeros(3), child_index=child_index, num_children=18)
    default = em_routing(votes, activations, torch.zeros(3), torch.zeros(3), child_index=child_index)
    for a, b in zip(given, default, strict=True):
        assert torch.equal(a, b)


def test_conv_layer_shares_each_child_among_all_overlapping_parents():
    torch.manual_seed(0)
    layer = ConvMatrixCapsules(in_types=3, out_types=4, kernel_size=3, stride=1)
    poses, activations = torch.randn(2, 3, 16, 5, 5), torch.rand(2, 3, 5, 5)
    child_index = layer.child_index(5, 5, poses.device)
    assert child_index.shape == (9, 27)
    # Every child is seen by as many windows as cover its position: 1 in a corner, 9 in the centre.
    counts = torch.bincount(child_index.reshape(-1), minlength=75).view(3, 5, 5)
    assert counts[0, 0, 0] == 1 and counts[0, 2, 2] == 9 and counts[0, 1, 2] == 6
    windows = layer._unfold(poses.reshape(2, 48, 5, 5)).reshape(2, 9, 9, 3, 4, 4)
    votes = torch.einsum("nqkiab,kijbc->nqkijac", windows, layer.weight).reshape(2, 9, 27, 4, 16)
    _, _, responsibilities = routed(votes, activations.reshape(2, -1), 4, child_index=child_index, iterations=3)
    per_child = torch.zeros(2, 75).index_add_(1, child_index.reshape(-1), responsibilities.sum(-1).reshape(2, -1))
    assert torch.allclose(per_child, torch.ones(2, 75), atol=1e-5)
    out_poses, out_activations = layer(poses, activations)
    assert out_poses.shape == (2, 4, 16, 3, 3) and out_activations.shape == (2, 4, 3, 3)


def test_conv_layer_with_kernel_covering_the_input_is_the_dense_layer():
    torch.manual_seed(0)
    layer = ConvMatrixCapsules(in_types=2, out_types=3, kernel_size=4, stride=1)
    poses, activations = torch.randn(2, 2, 16, 4, 4), torch.rand(2, 2, 4, 4)
    conv_poses, conv_activations = layer(poses, activations)
    # Dense: child (k, i) = type i at kernel position k, with its own W[k, i, j].
    matrices = poses.permute(0, 3, 4, 1, 2).reshape(2, 16, 2, 4, 4)  # (N, k = h * 4 + w, i, 4, 4)
    votes = torch.einsum("nkiab,kijbc->nkijac", matrices, layer.weight).reshape(2, 32, 3, 16)
    dense_activations = activations.permute(0, 2, 3, 1).reshape(2, 32)
    routing = layer.router.routing  # one window: route_per_window makes no difference
    mu, dense_out = em_routing(
        votes,
        dense_activations,
        layer.beta_u,
        layer.beta_a,
        routing,
        inverse_temperature_scale=layer.log_inverse_temperature.exp(),
    )
    assert torch.allclose(conv_poses.view(2, 3, 16), mu, atol=1e-5)
    assert torch.allclose(conv_activations.view(2, 3), dense_out, atol=1e-6)


@pytest.mark.parametrize(("identical", "scale"), [(True, 1.0), (True, 100.0), (False, 1e-6), (False, 1e4)])
def test_finite_for_identical_tiny_and_huge_votes(identical, scale):
    shape = (2, 1, 1, 1) if identical else (2, 30, 4, 16)  # identical: every child votes the same
    votes = (torch.randn(shape) * scale).expand(2, 30, 4, 16).clone()
    votes.requires_grad_()
    beta_u, beta_a = torch.zeros(4, requires_grad=True), torch.zeros(4, requires_grad=True)
    mu, activations = em_routing(votes, torch.rand(2, 30), beta_u, beta_a, EM_PAPER)
    (mu.sum() + activations.sum()).backward()
    for tensor in [mu, activations, votes.grad, beta_u.grad, beta_a.grad]:
        assert torch.isfinite(tensor).all()


def test_finite_under_bf16_autocast():
    torch.manual_seed(0)
    net = MatrixCapsNet(
        in_channels=1,
        num_classes=10,
        conv_channels=8,
        primary_types=4,
        conv_caps1_types=4,
        conv_caps2_types=4,
        image_size=28,
    )
    images = torch.rand(2, 1, 28, 28)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output = net(images)
    spread_loss(output.scores, torch.tensor([1, 2]), 0.2).backward()
    assert torch.isfinite(output.scores).all()
    assert all(torch.isfinite(p.grad).all() for p in net.parameters() if p.grad is not None)


def test_coordinate_addition_adds_scaled_centres_to_the_right_column():
    layer = ClassMatrixCapsules(in_types=2, num_classes=3)
    poses = torch.zeros(1, 2, 16, 3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing for the user to read (e.g. meshgrid's on indexing)
        votes = layer.votes(poses)  # M = 0: the votes are the offsets
    assert votes.shape == (1, 3, 3, 4, 2, 4, 4)  # (N, J, H, W, I, P, P)
    assert votes[0, 0, 2, 1, 0, 0, 3].item() == pytest.approx(2.5 / 3)  # row centre of h = 2
    assert votes[0, 0, 2, 1, 0, 1, 3].item() == pytest.approx(1.5 / 4)  # column centre of w = 1
    assert votes[..., 2:, :].abs().sum() == 0 and votes[..., :, :3].abs().sum() == 0
    assert ClassMatrixCapsules(2, 3, coordinate_addition=False).votes(poses).abs().sum() == 0


def test_primary_capsules_shapes_and_activation_range():
    poses, activations = PrimaryMatrixCapsules(8, 5)(torch.randn(2, 8, 6, 6))
    assert poses.shape == (2, 5, 16, 6, 6) and activations.shape == (2, 5, 6, 6)
    assert ((activations > 0) & (activations < 1)).all()


def test_model_geometry_and_parameter_count():
    net = MatrixCapsNet(
        in_channels=2,
        num_classes=5,
        image_size=32,
        conv1_norm=False,
        routing=EMRouting(learn_inverse_temperature=False),
    )
    # conv1 1,632 + primary 17,952 + two ConvCaps 147,520 each + class caps 2,570: the paper's ~310K.
    assert sum(p.numel() for p in net.parameters()) == 317_194
    # capsexp's recipe adds BatchNorm after conv1 (32 scales, 32 shifts) and a learned inverse
    # temperature per capsule layer
    assert sum(p.numel() for p in MatrixCapsNet(in_channels=2, num_classes=5, image_size=32).parameters()) == 317_261
    output = net(torch.rand(2, 2, 32, 32))
    assert output.scores.shape == (2, 5) and output.poses.shape == (2, 5, 16)
    # ConvCaps2 positions 0..3 sit at input pixels 8 + 4 h (centre 8.5 + 4 h of 32).
    assert torch.allclose(net.centres[:, 0, 0], (8.5 + 4 * torch.arange(4)) / 32)
    assert MatrixCapsNet(image_size=28, conv_channels=8, primary_types=4, conv_caps1_types=4, conv_caps2_types=4)(
        torch.rand(1, 1, 28, 28)
    ).scores.shape == (1, 10)


def test_spread_loss_hand_computed():
    activations = torch.tensor([[0.9, 0.2, 0.5], [0.1, 0.6, 0.7]])
    targets = torch.tensor([0, 1])
    # example 0: gaps 0.7 and 0.4 -> (0.5 - 0.4)^2 = 0.01; example 1: gaps 0.5, -0.1 -> 0 and 0.36
    assert spread_loss(activations, targets, 0.5).item() == pytest.approx((0.01 + 0.36) / 2, abs=1e-6)
    assert spread_loss(activations, targets, 0.0).item() == pytest.approx(0.01 / 2, abs=1e-6)


def test_margin_schedules_at_given_points():
    linear = LinearMargin(0.2, 0.9, duration=10, unit="epoch")
    assert [linear.margin(0, e) for e in (0, 5, 10, 20)] == pytest.approx([0.2, 0.55, 0.9, 0.9])
    assert LinearMargin(duration=1000, unit="step").margin(250, 0) == pytest.approx(0.375)
    # Over a fraction of the run: the same ramp in steps whatever the run's length, scaled to it.
    over_run = LinearMargin(duration=0.25, unit="run")
    assert [over_run.margin(s, 0, 1000) for s in (0, 125, 250, 900)] == pytest.approx([0.2, 0.55, 0.9, 0.9])
    assert over_run.margin(25, 0, 200) == pytest.approx(0.55)
    sigmoid = SigmoidMargin()
    assert sigmoid.margin(200_000, 0) == pytest.approx(0.2 + 0.79 * 0.5)
    assert sigmoid.margin(0, 0) == pytest.approx(0.2 + 0.79 / (1 + math.exp(4)))
    assert sigmoid.margin(10**9, 0) == pytest.approx(0.2 + 0.79 / (1 + math.exp(-10)))
    with pytest.raises(ValueError, match="unit"):
        LinearMargin(unit="hour")


def test_margin_continues_exactly_after_a_resume(mnist_dir, tmp_path):
    """Fit 2 epochs at once, or 1 then resume for the 2nd: the margins seen at every step agree."""

    class Record(L.Callback):
        def __init__(self):
            self.margins = {}

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.margins[trainer.global_step] = pl_module.objective.margin

    def fit(epochs, ckpt_path=None):
        torch.manual_seed(0)
        module = Classifier(
            LeNet5(),
            SpreadLoss(),
            functools.partial(torch.optim.SGD, lr=0.01),
            margin=LinearMargin(0.2, 0.9, duration=2, unit="epoch"),
        )
        record = Record()
        datamodule = MNISTDataModule(mnist_dir, batch_size=40, val_size=60, verify_checksums=False, download=False)
        trainer = L.Trainer(
            max_epochs=epochs,
            accelerator="cpu",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
            callbacks=[record],
        )
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
        return trainer, record.margins

    _, uninterrupted = fit(2)
    first, _ = fit(1)
    _, resumed = fit(
        2, ckpt_path=first.checkpoint_callback.last_model_path or first.checkpoint_callback.best_model_path
    )
    assert resumed and min(resumed) > 1
    assert all(resumed[step] == pytest.approx(uninterrupted[step]) for step in resumed)


def test_em_caps_trains_through_the_cli(mnist_dir, tmp_path):
    result = run_cli_in_process(
        *TINY_RUN,
        f"paths.data_dir={mnist_dir}",
        "model=em_caps",
        "data=mnist",
        *TINY_EM_CAPS,
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    events = load_events(tmp_path)
    tags = events.Tags()["scalars"]
    for tag in ["train/spread_loss_step", "train/margin", "val/acc", "test/acc"]:
        assert tag in tags, (tag, tags)
    assert events.Scalars("train/margin")[0].value == pytest.approx(0.2)


def test_training_steps_do_not_leak_memory():
    """The custom backward keeps nothing alive between steps (a reference cycle through autograd
    contexts once kept every step's factor tensors, ~150 MB a step at batch 8)."""
    import gc

    def live_tensors() -> int:
        gc.collect()
        return sum(1 for obj in gc.get_objects() if isinstance(obj, torch.Tensor))

    torch.manual_seed(0)
    layer = ConvMatrixCapsules(4, 4, kernel_size=3, stride=1)
    poses, activations = torch.randn(2, 4, 16, 5, 5), torch.rand(2, 4, 5, 5)

    def step() -> None:
        layer.zero_grad()
        out_poses, out_activations = layer(poses, activations)
        (out_poses.square().mean() + out_activations.mean()).backward()

    step()
    before = live_tensors()
    for _ in range(4):
        step()
    assert live_tensors() - before <= 0


def test_em_routing_rejects_bad_input():
    beta = torch.zeros(3)

    def refused(message: str, *args, **kwargs) -> None:
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):  # the whole message, as the user reads it
            em_routing(*args, **kwargs)

    refused(
        "convolutional votes (B, Q, M, J, H) need child_index (Q, M)",
        torch.randn(2, 4, 5, 3, 16),
        torch.rand(2, 20),
        beta,
        beta,
    )
    dense = (torch.randn(2, 5, 3, 16), torch.rand(2, 5), beta, beta)
    refused("child_index is for convolutional votes (B, Q, M, J, H)", *dense, child_index=torch.zeros(1, 5).long())
    # The options' ranges are EMRouting's, checked once, when it is built.
    for bad in ({"iterations": 0}, {"cost_normalization": "z"}, {"sigma_eps": 0.0}, {"e_step_temperature": 0.0}):
        with pytest.raises(ValueError, match=f"^EMRouting: {next(iter(bad))}="):
            EMRouting(**bad)


def test_em_routing_defaults_are_the_papers():
    """Procedure 1 as published (Hinton, Sabour & Frosst 2018 and the authors' OpenReview answers): 3
    iterations, final lambda 0.01, plain costs, shared children, no learned temperature, gradients
    through the E-steps, T = 1; the model configs choose capsexp's recipe (EMRouting()) or this."""
    assert inspect.signature(em_routing).parameters["routing"].default is EM_PAPER
    assert {"_target_": "capsexp.nn.EMRouting", **dataclasses.asdict(EM_PAPER)} == EM_ROUTING_PAPER
    assert recipe_routing("em_caps_paper") == EM_PAPER and recipe_routing("em_caps") == EMRouting()


def test_routing_leaves_the_callers_votes_as_they_were():
    torch.manual_seed(0)
    parent_major = torch.randn(2, 3, 6, 16) + 5  # (B, J, I, H) in memory, as a layer may make them
    kept = parent_major.clone()
    em_routing(parent_major.transpose(1, 2), torch.rand(2, 6), torch.zeros(3), torch.zeros(3))
    assert torch.equal(parent_major, kept)


def test_responsibility_entropy_is_one_when_uniform_and_zero_when_hard():
    uniform = torch.full((2, 6, 4), 0.25)
    assert torch.allclose(responsibility_entropy(uniform), torch.ones(2, 6))
    hard = torch.nn.functional.one_hot(torch.randint(0, 4, (2, 6)), 4).float()
    assert torch.allclose(responsibility_entropy(hard), torch.zeros(2, 6))
    # Convolutional: a child under several windows is uniform over all (window, parent) pairs. Two
    # parent types: a corner child has only two parents (log 2 < 1).
    layer = ConvMatrixCapsules(in_types=2, out_types=2, kernel_size=2, stride=1)
    child_index = layer.child_index(3, 3, torch.device("cpu"))
    counts = torch.bincount(child_index.reshape(-1), minlength=18).double()
    spread = (1.0 / (counts[child_index] * 2)).unsqueeze(0).unsqueeze(-1).expand(2, *child_index.shape, 2)
    ones = torch.ones(2, 18, dtype=torch.float64)
    torch.testing.assert_close(responsibility_entropy(spread, child_index, 18), ones, rtol=1e-12, atol=1e-12)
    # num_children defaults to the largest index + 1.
    torch.testing.assert_close(responsibility_entropy(spread, child_index), ones, rtol=1e-12, atol=1e-12)


def test_routing_entropy_of_a_real_layer_lies_in_the_unit_interval_and_falls_with_iterations():
    torch.manual_seed(0)
    votes, activations = torch.randn(4, 40, 8, 16), torch.rand(4, 40)
    entropies = []
    for iterations in (1, 2, 3):
        *_, responsibilities = routed(votes, activations, 8, iterations=iterations)
        entropies.append(responsibility_entropy(responsibilities).mean().item())
    assert entropies[0] == pytest.approx(1.0)  # before any E-step R is uniform
    assert 0 <= entropies[2] <= entropies[1] < 1


def test_a_warmer_e_step_softens_the_assignments_towards_the_parent_activations():
    """R_ij proportional to a_j N(V_ij)^(1/T): entropy rises with T, and as T grows R tends to a_j
    normalised over the parents (the votes no longer matter)."""
    torch.manual_seed(0)
    votes, activations = torch.randn(4, 40, 8, 16), torch.rand(4, 40)
    entropies = []
    for temperature in (1.0, 4.0, 16.0):
        *_, responsibilities = routed(votes, activations, 8, iterations=2, e_step_temperature=temperature)
        entropies.append(responsibility_entropy(responsibilities).mean().item())
    assert entropies[0] < entropies[1] < entropies[2] < 1
    *_, responsibilities = routed(votes, activations, 8, iterations=2, e_step_temperature=1e6)
    first_m_step = routed(votes, activations, 8, iterations=1)[1]  # the activations the E-step weighs by
    expected = (first_m_step / first_m_step.sum(-1, keepdim=True)).unsqueeze(1).expand_as(responsibilities)
    torch.testing.assert_close(responsibilities, expected, rtol=1e-3, atol=1e-5)


def test_net_options_batchnorm_and_weight_scale():
    net = MatrixCapsNet(
        in_channels=1,
        conv_channels=8,
        primary_types=4,
        conv_caps1_types=4,
        conv_caps2_types=4,
        image_size=28,
        conv1_norm=True,
        weight_std=2.0,
    )
    assert isinstance(net.conv1_norm, torch.nn.BatchNorm2d)
    assert 1.5 < net.conv_caps1.weight.std().item() < 2.5
    assert net(torch.rand(3, 1, 28, 28)).scores.shape == (3, 10)
    assert isinstance(
        MatrixCapsNet(
            conv_channels=8, primary_types=4, conv_caps1_types=4, conv_caps2_types=4, conv1_norm=False
        ).conv1_norm,
        torch.nn.Identity,
    )


def test_routing_diagnostics_are_logged_for_each_em_layer(mnist_dir, tmp_path):
    result = run_cli_in_process(
        *TINY_RUN,
        f"paths.data_dir={mnist_dir}",
        "model=em_caps_small",
        "data=mnist",
        *TINY_EM_CAPS,
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1",
        "callbacks.routing_diagnostics.every_n_steps=2",
        "model.net.routing.learn_inverse_temperature=true",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    events = load_events(tmp_path, histograms=0)
    scalars, histograms = events.Tags()["scalars"], events.Tags()["histograms"]
    for layer in ("conv_caps1", "conv_caps2", "class_caps"):
        entropy = events.Scalars(f"routing/{layer}/entropy")
        assert [e.step for e in entropy] == [0, 2]  # every 2 steps, from the first
        assert all(0 <= e.value <= 1 for e in entropy)
        assert 0 < events.Scalars(f"routing/{layer}/activation_mean")[0].value < 1
        assert 0 < events.Scalars(f"routing/{layer}/activation_std_across_inputs")[0].value < 0.5
        # Logged after the step's update: one Adam step (lr 3e-3) from 1.
        scale = events.Scalars(f"routing/{layer}/inverse_temperature_scale")
        assert [e.step for e in scale] == [0, 2] and scale[0].value == pytest.approx(1.0, abs=0.01)
        assert events.Scalars(f"grad_norm/{layer}")[0].value > 0
        assert f"routing/{layer}/activations" in histograms
    assert "train/margin" in scalars
    for histogram in ("activation_present", "activation_absent", "responsibility_to_present"):
        values = events.Histograms(f"routing/class_caps/{histogram}")[-1].histogram_value
        assert values.num > 0 and values.min >= 0 and values.max <= 1, histogram
    # The responsibilities as a labelled heat map per class (two rows of five, a colour bar) on the
    # diverging scale: cells red or blue, not only the white of the uniform share.
    figure = load_events(tmp_path, images=0).Images("routing/class_caps/responsibilities")[-1]
    assert figure.width >= 1000 and figure.height >= 350
    pixels = np.asarray(Image.open(io.BytesIO(figure.encoded_image_string)).convert("RGB")).astype(int)
    assert (np.abs(pixels[..., 0] - pixels[..., 2]) > 60).mean() > 0.01
    # The presence medians on validation data (their values: tests/test_classifier.py).
    assert -1 < events.Scalars("val/presence_gap")[-1].value < 1
    assert 0 < events.Scalars("val/presence_target")[-1].value < 1
    assert 0 < events.Scalars("val/presence_largest_other")[-1].value < 1


def test_route_per_window_only_differs_where_windows_overlap():
    torch.manual_seed(0)
    poses, activations = torch.randn(2, 3, 16, 4, 4), torch.rand(2, 3, 4, 4)
    shared = ConvMatrixCapsules(3, 4, kernel_size=2, stride=2, routing=EMRouting(route_per_window=False))
    per_window = ConvMatrixCapsules(3, 4, kernel_size=2, stride=2, routing=EMRouting(route_per_window=True))
    per_window.load_state_dict(shared.state_dict())
    for a, b in zip(shared(poses, activations), per_window(poses, activations), strict=True):  # no overlap: the same
        assert torch.allclose(a, b, atol=1e-6)
    shared.stride = per_window.stride = 1  # overlap: not the same
    assert not torch.allclose(shared(poses, activations)[1], per_window(poses, activations)[1], atol=1e-4)
    # Per window, each slot's responsibilities sum to 1 over the parent types of its own position.
    windows = per_window._unfold(poses.reshape(2, 48, 4, 4)).reshape(2, 9, 4, 3, 4, 4)
    votes = torch.einsum("nqkiab,kijbc->nqkijac", windows, per_window.weight).reshape(2, 9, 12, 4, 16)
    slot_activations = activations.reshape(2, -1)[:, per_window.child_index(4, 4, poses.device).reshape(-1)]
    _, _, responsibilities = routed(votes, slot_activations, 4, iterations=2, child_index=torch.arange(108).view(9, 12))
    assert torch.allclose(responsibilities.sum(-1), torch.ones(2, 9, 12), atol=1e-5)


def test_a_printed_em_layer_shows_its_routing_options():
    routing = EMRouting(iterations=3, final_lambda=0.5)
    text = repr(ConvMatrixCapsules(2, 3, routing=routing))
    assert f"(router): EMRouter({routing!r})" in text and "iterations=3" in text and "final_lambda=0.5" in text


@pytest.mark.parametrize("normalization", ["none", "data", "standardize", "layer"])
def test_parents_given_identical_votes_get_identical_activations_under_every_cost_normalisation(normalization):
    """Ten parents, every vote the same for each: their costs tie, so their activations do, and under
    standardised costs they sit at the tie's sigmoid(lambda (beta_a - 0)) = 0.5, not at 0 or 1 as rounding
    noise of the costs, blown up by a tiny std, gave them."""
    torch.manual_seed(0)
    for scale, offset in ((1.0, 0.0), (0.1, 5.0), (30.0, 90.0)):
        votes = (torch.randn(4, 72, 1, 16) * scale + offset).expand(4, 72, 10, 16)
        routing = EMRouting(cost_normalization=normalization, learn_inverse_temperature=False)
        _, activations = em_routing(votes, torch.rand(4, 72), torch.zeros(10), torch.zeros(10), routing)
        spread = activations.max(dim=-1).values - activations.min(dim=-1).values
        assert spread.max() <= 1e-6, (normalization, scale)
        if normalization == "standardize":
            torch.testing.assert_close(activations, torch.full_like(activations, 0.5), atol=1e-3, rtol=0)
