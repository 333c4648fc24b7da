"""Variational Bayes routing against an independent float64 transcription of the authors' code (values and
gradients), where their normalisation of the responsibilities loses mass or gives NaN and ours does not,
its invariants, float32 against float64 and bf16 autocast."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from capsexp.models import MatrixCapsNet
from capsexp.nn import ConvMatrixCapsules, VBRouting
from capsexp.nn.functional import VoteMaker, vb_routing
from capsexp.nn.routers import make_router

B, I, J, D = 2, 6, 3, 16  # 16-D poses, as in CapsNet's place
OFFICIAL_CLAMP = 1e-11  # src/vb_routing.py line 232 (78fb69d): 1. / torch.clamp(sum_p_j, min=1e-11) * p_j


def transcribe_official(votes, activations, beta_u, beta_a, iterations, normalise_as_official=True):
    """fabio-deep/Variational-Capsule-Routing, src/vb_routing.py at 78fb69d, VariationalBayesRouting2d with
    cov='diag' and the priors of src/capsnet.py (alpha0 = kappa0 = 1, m0 = 0, Psi0 = I, nu0 = D + 1), for
    one window of children (its class-capsule use): ``forward`` (lines 79-110, before the batch norms),
    ``update_qparam`` (139-167) and ``update_qlatent`` (189-232), one example, child and parent at a time.
    ``normalise_as_official``: the responsibilities as line 232 normalises them (probability space, the
    sum clamped at 1e-11); else divided by their plain sum."""
    alpha0, kappa0, nu0, psi0 = 1.0, 1.0, D + 1.0, 1.0
    digamma = torch.special.digamma
    poses_out, logits_out, resp_out = [], [], []
    for n in range(votes.shape[0]):
        r = [[votes.new_tensor(1.0 / J) for _ in range(J)] for _ in range(I)]
        for iteration in range(iterations):
            # update_qparam: R_ij = R_ij * a_i; R_j; alpha, kappa, nu; mu_j; m_j; sigma_j; invPsi_j; lndet
            weight = [[r[i][j] * activations[n, i] for j in range(J)] for i in range(I)]
            mass = [sum(weight[i][j] for i in range(I)) for j in range(J)]
            alpha = [alpha0 + mass[j] for j in range(J)]
            kappa = [kappa0 + mass[j] for j in range(J)]
            nu = [nu0 + mass[j] for j in range(J)]
            mu = [(1.0 / mass[j]) * sum(weight[i][j] * votes[n, i, j] for i in range(I)) for j in range(J)]
            m = [(1.0 / kappa[j]) * (mass[j] * mu[j]) for j in range(J)]
            sigma = [sum(weight[i][j] * (votes[n, i, j] - mu[j]) ** 2 for i in range(I)) for j in range(J)]
            inv_psi = [psi0 + sigma[j] + (mass[j] / kappa[j]) * mu[j] ** 2 for j in range(J)]
            lndet_psi = [-torch.log(inv_psi[j]).sum() for j in range(J)]
            # the expectations update_qlatent and forward both compute
            e_ln_pi = [digamma(alpha[j]) - digamma(sum(alpha)) for j in range(J)]
            e_ln_lambda = [
                sum(digamma(0.5 * (nu[j] - d)) for d in range(D)) + D * math.log(2.0) + lndet_psi[j] for j in range(J)
            ]
            if iteration == iterations - 1:
                break
            # update_qlatent: ElnQ, lnp_j, p_j = exp(Elnpi_j + lnp_j), normalised over the parents
            p = []
            for i in range(I):
                row = []
                for j in range(J):
                    e_q = D / kappa[j] + nu[j] * ((1.0 / inv_psi[j]) * (votes[n, i, j] - m[j]) ** 2).sum()
                    ln_p = 0.5 * e_ln_lambda[j] - 0.5 * D * math.log(2 * math.pi) - 0.5 * e_q
                    row.append(torch.exp(e_ln_pi[j] + ln_p))
                p.append(row)
            if normalise_as_official:
                r = [[1.0 / torch.clamp(sum(p[i]), min=OFFICIAL_CLAMP) * p[i][j] for j in range(J)] for i in range(I)]
            else:
                r = [[p[i][j] / sum(p[i]) for j in range(J)] for i in range(I)]
        # forward, lines 98-110: the entropy of q(mu_j, Lambda_j) and the activation logits
        entropy = [0.5 * D * math.log(2 * math.pi * math.e) - 0.5 * e_ln_lambda[j] for j in range(J)]
        logits = [beta_a[j] - (torch.exp(e_ln_pi[j]) * entropy[j] + beta_u[j]) for j in range(J)]
        poses_out.append(torch.stack(m)), logits_out.append(torch.stack(logits))
        resp_out.append(torch.stack([torch.stack(row) for row in r]))
    return torch.stack(poses_out), torch.stack(logits_out), torch.stack(resp_out)


def inputs(scale: float, seed: int = 0, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    votes = scale * torch.randn(B, I, J, D, generator=generator, dtype=torch.float64) / math.sqrt(D)  # norm ~ scale
    activations = torch.rand(B, I, generator=generator, dtype=torch.float64) * 0.9 + 0.1
    beta_u, beta_a = 0.1 * torch.randn(2, J, generator=generator, dtype=torch.float64)
    return [t.to(dtype) for t in (votes, activations, beta_u, beta_a)]


@pytest.mark.parametrize("iterations", [1, 2, 3])
def test_vb_routing_is_the_official_codes_where_its_normalisation_holds_values_and_gradients(iterations):
    votes, activations, beta_u, beta_a = (t.requires_grad_() for t in inputs(0.5))
    ours = vb_routing(votes, activations, beta_u, beta_a, VBRouting(iterations=iterations))
    official = transcribe_official(votes, activations, beta_u, beta_a, iterations)
    for got, want in zip(ours, official, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    upstream = [torch.randn_like(t) for t in official[:2]]
    leaves = (votes, activations, beta_u, beta_a)
    got = torch.autograd.grad(ours[:2], leaves, upstream)
    want = torch.autograd.grad(official[:2], leaves, upstream)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("iterations", [2, 3])
def test_a_loss_on_the_responsibilities_moves_the_votes_as_in_the_official_code(iterations):
    """An entropy penalty on the responsibilities (routing-entropy regularisers) gives every input the
    gradient the official code's differentiable responsibilities give it, alone and beside a loss on the
    poses."""
    votes, activations, beta_u, beta_a = (t.requires_grad_() for t in inputs(0.5, seed=3))
    leaves = (votes, activations, beta_u, beta_a)

    def entropy(r):
        return -(r * r.log()).sum()

    ours = vb_routing(votes, activations, beta_u, beta_a, VBRouting(iterations=iterations))
    official = transcribe_official(votes, activations, beta_u, beta_a, iterations)
    for loss_of in (lambda out: entropy(out[2]), lambda out: entropy(out[2]) + (out[0] * out[0].detach()).sum()):
        got = torch.autograd.grad(loss_of(ours), leaves, retain_graph=True, materialize_grads=True)
        want = torch.autograd.grad(loss_of(official), leaves, retain_graph=True, materialize_grads=True)
        assert got[0].abs().amax() > 1e-3  # a loss on the responsibilities reaches the votes
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-11)


def test_the_official_normalisation_loses_mass_from_vote_norms_of_2_and_gives_nan_where_ours_sums_to_one():
    lost, nan = {}, {}
    for scale in (0.5, 1.0, 2.0, 4.0, 16.0):
        votes, activations, beta_u, beta_a = inputs(scale)
        official = transcribe_official(votes, activations, beta_u, beta_a, 3)
        ours = vb_routing(votes, activations, beta_u, beta_a, VBRouting(iterations=3))
        torch.testing.assert_close(ours.responsibilities.sum(-1), torch.ones(B, I, dtype=torch.float64))
        assert all(torch.isfinite(t).all() for t in ours)
        lost[scale] = (1 - official[2].sum(-1)).max().item()
        nan[scale] = torch.isnan(official[0]).any().item()
        if lost[scale] < 1e-9:  # where the clamp does not bite, the same answer
            torch.testing.assert_close(ours.poses, official[0], rtol=1e-9, atol=1e-12)
    assert lost[0.5] < 1e-12 and lost[1.0] < 1e-12  # 16-D votes of norm 1: no mass lost
    assert lost[2.0] > 0.5  # norm 2: a child has lost most of its responsibilities (measured: all)
    assert nan[16.0] and not nan[4.0]  # norm 16: in float64 too, a parent's every p_ij underflows: 0 / 0
    # In float32, the code's dtype, NaN from norm 4, with the plain sum (no clamp) as well: what holds is
    # the log domain, whose float32 responsibilities still sum to 1.
    votes, activations, beta_u, beta_a = inputs(4.0, dtype=torch.float32)
    for normalise_as_official in (True, False):
        official = transcribe_official(votes, activations, beta_u, beta_a, 3, normalise_as_official)
        assert torch.isnan(official[0]).any()
    ours = vb_routing(votes, activations, beta_u, beta_a)
    assert all(torch.isfinite(t).all() for t in ours)
    torch.testing.assert_close(ours.responsibilities.sum(-1), torch.ones(B, I))


@pytest.mark.parametrize("kind", ["identical", "tiny", "huge", "inactive"])
def test_vb_routing_is_finite_with_its_gradients_on_identical_tiny_and_huge_votes(kind):
    votes, activations, beta_u, beta_a = inputs(1.0, dtype=torch.float32)
    if kind == "identical":
        votes = votes[:1, :1].expand_as(votes).clone()
    elif kind == "tiny":
        votes = votes * 1e-20
    elif kind == "huge":
        votes = votes * 1e6
    else:  # no child active: every R_j is 0
        activations = torch.zeros_like(activations)
    votes.requires_grad_()
    activations.requires_grad_()
    routed = vb_routing(votes, activations, beta_u, beta_a)
    gradients = torch.autograd.grad(routed.poses.sum() + routed.activation_logits.sum(), (votes, activations))
    assert all(torch.isfinite(t).all() for t in (*routed, *gradients))
    torch.testing.assert_close(routed.responsibilities.sum(-1), torch.ones(B, I))


@pytest.mark.parametrize("spread", [0.01, 0.03])
def test_float32_matches_float64_for_votes_far_from_zero(spread):
    """EM routing's bound (tests/test_em_caps.py): votes offset 20 with a small spread, float32 within 1e-3
    of float64 in poses, activations and the relative vote gradient."""
    generator = torch.Generator().manual_seed(0)
    votes = 20 + spread * torch.randn(B, 50, J, D, generator=generator, dtype=torch.float64)
    activations = torch.rand(B, 50, generator=generator, dtype=torch.float64)
    beta_u, beta_a = torch.randn(2, J, generator=generator, dtype=torch.float64)
    upstream = None
    results = {}
    for dtype in (torch.float64, torch.float32):
        leaf = votes.to(dtype).requires_grad_()
        routed = vb_routing(leaf, activations.to(dtype), beta_u.to(dtype), beta_a.to(dtype))
        if upstream is None:
            upstream = (torch.randn_like(routed.poses), torch.randn_like(routed.activation_logits))
        outputs = (routed.poses, routed.activation_logits)
        (grad,) = torch.autograd.grad(outputs, leaf, [u.to(dtype) for u in upstream])
        results[dtype] = [t.detach().double() for t in (*outputs, grad)]
    (m64, a64, g64), (m32, a32, g32) = results[torch.float64], results[torch.float32]
    assert (m32 - m64).abs().max() < 1e-3 and (a32 - a64).abs().max() < 1e-3
    assert (g32 - g64).norm() / g64.norm() < 1e-3


def test_under_bf16_autocast_routing_runs_in_float32():
    votes, activations, beta_u, beta_a = inputs(1.0, dtype=torch.float32)
    exact = vb_routing(votes, activations, beta_u, beta_a)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = vb_routing(votes, activations, beta_u, beta_a)
        from_bf16 = vb_routing(votes.bfloat16(), activations.bfloat16(), beta_u, beta_a)
    assert autocast.poses.dtype == torch.float32 and from_bf16.poses.dtype == torch.float32
    torch.testing.assert_close(autocast.poses, exact.poses)
    assert (from_bf16.activation_logits - exact.activation_logits).abs().max() < 0.05  # bf16 inputs' rounding


def test_the_router_gives_activations_in_0_1_and_a_wishart_prior_with_too_few_degrees_is_refused():
    with pytest.raises(ValueError, match="nu0_offset"):
        VBRouting(nu0_offset=-1.0)
    router = make_router(VBRouting(), I, 8, J, D)
    votes, activations, _, _ = inputs(1.0, dtype=torch.float32)
    routed = router(votes, None, activations)
    assert routed.poses.shape == (B, J, D) and ((routed.activations > 0) & (routed.activations < 1)).all()
    assert {name for name, _ in router.named_parameters()} == {"beta_u", "beta_a"}


def test_the_digamma_an_exported_model_computes_is_torchs(monkeypatch):
    from capsexp.nn.functional import _vb_routing

    x = torch.cat([torch.linspace(0.5, 20, 400, dtype=torch.float64), torch.logspace(1.5, 4, 50, dtype=torch.float64)])
    monkeypatch.setattr(_vb_routing, "exporting", lambda: True)
    torch.testing.assert_close(_vb_routing._digamma(x), torch.digamma(x), rtol=0, atol=1e-9)


def _given(votes: torch.Tensor):
    """A VoteMaker of parent-major votes (B, Q, J, M, D) given as a tensor."""
    return VoteMaker(lambda v, out=None: v, (votes,), (), tuple(votes.shape[1:]))


def _conv_inputs(positions: int, slots: int, children: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    votes = torch.randn(B, positions, J, slots, D, generator=generator, dtype=torch.float64) / math.sqrt(D)
    activations = torch.rand(B, children, generator=generator, dtype=torch.float64) * 0.9 + 0.1
    beta_u, beta_a = 0.1 * torch.randn(2, J, generator=generator, dtype=torch.float64)
    return votes.requires_grad_(), activations, beta_u, beta_a


def test_in_a_convolutional_layer_each_window_routes_as_a_dense_layer_of_its_own_children():
    """Every (window, slot) a child of its own, as the authors' code routes a ConvCaps layer: each position is
    the dense routing (tested against the code above) of its window's votes, the Dirichlet's sum over the
    parent types of that position alone."""
    positions, slots = 3, 5
    votes, activations, beta_u, beta_a = _conv_inputs(positions, slots, positions * slots)
    index = torch.arange(positions * slots).view(positions, slots)
    conv = vb_routing(_given(votes), activations, beta_u, beta_a, VBRouting(), child_index=index)
    per_window = votes.permute(0, 1, 3, 2, 4).reshape(B * positions, slots, J, D)
    dense = vb_routing(per_window, activations.view(B * positions, slots), beta_u, beta_a, VBRouting())
    torch.testing.assert_close(conv.poses.reshape(B * positions, J, D), dense.poses, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(conv.activation_logits.reshape(B * positions, J), dense.activation_logits)
    torch.testing.assert_close(conv.responsibilities.reshape(B * positions, slots, J), dense.responsibilities)
    grad = torch.autograd.grad(conv.activation_logits.sum(), votes)[0]
    dense_grad = torch.autograd.grad(dense.activation_logits.sum(), votes)[0]
    torch.testing.assert_close(grad, dense_grad, rtol=1e-9, atol=1e-12)


def test_a_child_under_several_windows_shares_its_responsibilities_among_all_their_parents():
    """Without route_per_window: the responsibilities of a child held by several windows sum to 1 over every
    parent of every one of them (EM routing's paper's sharing), and they differ from routing each window
    on its own; finite for votes of norm 1,000."""
    children = 4
    index = torch.tensor([[0, 1], [1, 2], [2, 3]])  # three windows of two slots, overlapping by one
    for scale in (1.0, 1e3):
        votes, activations, beta_u, beta_a = _conv_inputs(3, 2, children)
        votes = (scale * votes).detach().requires_grad_()
        shared = vb_routing(_given(votes), activations, beta_u, beta_a, VBRouting(), child_index=index)
        per_child = torch.zeros(B, children, dtype=torch.float64).index_add_(
            1, index.flatten(), shared.responsibilities.sum(-1).reshape(B, -1)
        )
        torch.testing.assert_close(per_child, torch.ones(B, children, dtype=torch.float64))
        assert all(torch.isfinite(t).all() for t in shared)
        assert torch.isfinite(torch.autograd.grad(shared.activation_logits.sum(), votes)[0]).all()
    own = vb_routing(
        _given(votes), activations[:, index.flatten()], beta_u, beta_a, child_index=torch.arange(6).view(3, 2)
    )
    assert not torch.allclose(own.activation_logits, shared.activation_logits)


@pytest.mark.parametrize("route_per_window", [True, False])
def test_vb_in_the_matrix_capsule_net_normalises_its_parents_and_trains_every_layer(route_per_window):
    """model=em_caps model/routing=vb's layers, as the authors' layer ends: each parent type's poses
    batch-normalised (mean 0, variance 1 over the batch, positions and pose elements, in training), the
    activations in (0, 1); every layer's W, beta_u and beta_a get a gradient."""
    torch.manual_seed(0)
    routing = VBRouting(route_per_window=route_per_window)
    # W of std 0.5: poses spread well above BatchNorm's eps, so that their variance reads 1
    layer = ConvMatrixCapsules(in_types=2, out_types=3, kernel_size=3, stride=1, routing=routing, weight_std=0.5)
    poses, activations = layer(torch.randn(4, 2, 16, 5, 5), torch.rand(4, 2, 5, 5))
    assert poses.shape == (4, 3, 16, 3, 3) and activations.shape == (4, 3, 3, 3)
    per_type = poses.transpose(0, 1).reshape(3, -1)
    torch.testing.assert_close(per_type.mean(1), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(per_type.var(1, unbiased=False), torch.ones(3), atol=1e-3, rtol=0)
    assert ((activations > 0) & (activations < 1)).all()
    net = MatrixCapsNet(conv_channels=8, primary_types=4, conv_caps1_types=4, conv_caps2_types=4, routing=routing)
    output = net(torch.rand(3, 1, 28, 28))
    assert output.scores.shape == (3, 10) and output.poses.shape == (3, 10, 16)
    F.cross_entropy(output.scores, torch.tensor([0, 1, 2])).backward()
    for name, parameter in net.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_under_vb_routing_the_transformation_matrices_start_at_the_authors_xavier_std():
    """src/layers.py ConvCapsules2d: std sqrt(2 / (fan_in + fan_out)), fan_in = B K K P^2, fan_out = C K K P^2
    (the class layer built with K = 1); EM keeps 1/sqrt(P), and a given weight_std wins."""
    torch.manual_seed(0)
    sizes = dict(conv_channels=8, primary_types=8, conv_caps1_types=16, conv_caps2_types=16)
    net = MatrixCapsNet(routing=VBRouting(), **sizes)
    expected = {
        "conv_caps1": math.sqrt(2 / (8 * 9 * 16 + 16 * 9 * 16)),
        "conv_caps2": math.sqrt(2 / (16 * 9 * 16 + 16 * 9 * 16)),
        "class_caps": math.sqrt(2 / (16 * 16 + 10 * 16)),
    }
    for name, std in expected.items():
        assert getattr(net, name).weight.std().item() == pytest.approx(std, rel=0.05), name
    assert MatrixCapsNet(**sizes).conv_caps1.weight.std().item() == pytest.approx(0.5, rel=0.05)
    given = MatrixCapsNet(routing=VBRouting(), weight_std=0.3, **sizes)
    assert given.class_caps.weight.std().item() == pytest.approx(0.3, rel=0.1)


def test_a_small_vb_capsule_net_learns_where_each_class_puts_its_bar():
    """A small model=vb_caps-like net (BatchNorm'd PrimaryCaps, VB in every capsule layer, cross-entropy on
    the class activations) fits a batch of four classes of images, each class a bar at its own place, in
    30 steps (initialised as EM's, with W of std 0.5, it stayed near chance)."""
    torch.manual_seed(0)
    targets = torch.arange(32) % 4
    images = 0.1 * torch.rand(32, 1, 20, 20)
    for label in range(4):
        images[targets == label, :, 4 * label + 2 : 4 * label + 5, 3:17] += 1.0
    sizes = dict(conv_channels=16, primary_types=4, conv_caps1_types=4, conv_caps2_types=4)
    net = MatrixCapsNet(image_size=20, num_classes=4, routing=VBRouting(), primary_norm=True, **sizes)
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    for _ in range(30):
        scores = net(images).scores
        loss = F.cross_entropy(scores, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert (scores.argmax(1) == targets).float().mean() >= 0.9


def test_votes_and_child_activations_of_other_shapes_are_refused():
    with pytest.raises(ValueError, match=r"child activations \(B, I\) expected, got \(2, 5, 3, 4\) and \(2, 6\)"):
        vb_routing(torch.randn(2, 5, 3, 4), torch.rand(2, 6), torch.zeros(3), torch.zeros(3))
