"""The routing algorithms besides dynamic and EM routing, each against an independent float64
transcription of its paper's equations (written child by child and parent by parent, as the papers
state them: values and gradients), its invariants, and float32 against float64 on ill-conditioned votes
(votes far from zero compared with their spread)."""

from __future__ import annotations

import math

import pytest
import torch

from capsexp.nn import SinkhornRouting
from capsexp.nn.functional import (
    attention_routing,
    dynamic_routing,
    efficient_routing,
    efficient_squash,
    random_routing,
    self_routing,
    sinkhorn_routing,
    squash,
    uniform_routing,
)

B, I, J, D = 2, 5, 3, 4  # small enough for the loops of the transcriptions


def _votes(offset: float = 0.0, spread: float = 1.0, dtype=torch.float64, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (offset + spread * torch.randn(B, I, J, D, generator=generator, dtype=torch.float64)).to(dtype)


def _softmax(values: list[torch.Tensor]) -> list[torch.Tensor]:
    largest = max(values)
    exps = [torch.exp(v - largest) for v in values]
    total = sum(exps)
    return [e / total for e in exps]


def _length(vector: torch.Tensor) -> torch.Tensor:
    return torch.sqrt(sum(x * x for x in vector))


# The transcriptions: scalars and D-vectors, one example at a time; nothing shared with the code.


def transcribe_self_routing(votes, activations, logits):
    """Hahn et al. 2019: c_ij = softmax_j(logits_ij); a_j = sum_i c_ij a_i / sum_i a_i;
    u_j = sum_i c_ij a_i u_hat_j|i / sum_i c_ij a_i."""
    poses, parents = [], []
    for b in range(votes.shape[0]):
        c = [_softmax([logits[b, i, j] for j in range(J)]) for i in range(I)]
        total = sum(activations[b, i] for i in range(I))
        pose_row, activation_row = [], []
        for j in range(J):
            weight = sum(c[i][j] * activations[b, i] for i in range(I))
            activation_row.append(weight / total)
            pose_row.append(sum(c[i][j] * activations[b, i] * votes[b, i, j] for i in range(I)) / weight)
        poses.append(torch.stack(pose_row)), parents.append(torch.stack(activation_row))
    return torch.stack(poses), torch.stack(parents)


def transcribe_attention_routing(votes, iterations, norm_weight, norm_bias, score_weight, score_bias):
    """Tsai et al. 2020, Procedure 1: p = 0; T times: a_ij = p_j . v_ij / sqrt(D), r_ij = softmax_j(a_ij),
    p_j = LayerNorm(sum_i r_ij v_ij) (no LayerNorm for D = 1, as the official code); the class logit w . p_j + b."""
    dim = votes.shape[-1]

    def layer_norm(s):
        if dim == 1:
            return s
        mean = sum(s) / dim
        variance = sum((x - mean) ** 2 for x in s) / dim
        return torch.stack(
            [(s[d] - mean) / torch.sqrt(variance + 1e-5) * norm_weight[d] + norm_bias[d] for d in range(dim)]
        )

    poses, scores = [], []
    for b in range(votes.shape[0]):
        p = [torch.zeros(dim, dtype=votes.dtype) for _ in range(J)]
        for _ in range(iterations):
            r = [_softmax([torch.dot(p[j], votes[b, i, j]) / math.sqrt(dim) for j in range(J)]) for i in range(I)]
            p = [layer_norm(sum(r[i][j] * votes[b, i, j] for i in range(I))) for j in range(J)]
        poses.append(torch.stack(p))
        scores.append(torch.stack([torch.dot(score_weight, p[j]) + score_bias for j in range(J)]))
    return torch.stack(poses), torch.sigmoid(torch.stack(scores))


def transcribe_efficient_routing(votes, log_priors):
    """Mazzia et al. 2021: A_j = U_j U_j^T / sqrt(D); c_ij = softmax_j(sum_k A_j,ik);
    s_j = sum_i (c_ij + b_ij) u_hat_j|i; v_j = (1 - exp(-|s_j|)) s_j / |s_j|."""
    poses = []
    for b in range(votes.shape[0]):
        attention = [
            [sum(torch.dot(votes[b, i, j], votes[b, k, j]) for k in range(I)) / math.sqrt(D) for j in range(J)]
            for i in range(I)
        ]
        c = [_softmax(attention[i]) for i in range(I)]
        row = []
        for j in range(J):
            s = sum((c[i][j] + log_priors[i, j]) * votes[b, i, j] for i in range(I))
            norm = _length(s)
            row.append((1 - torch.exp(-norm)) * s / norm)
        poses.append(torch.stack(row))
    return torch.stack(poses)


def transcribe_uniform_routing(votes):
    """c_ij = 1/J; v_j = squash(sum_i c_ij u_hat_j|i), Eq. 1: |s|^2 / (1 + |s|^2) s / |s|."""
    poses = []
    for b in range(votes.shape[0]):
        row = []
        for j in range(J):
            s = sum(votes[b, i, j] for i in range(I)) / J
            norm = _length(s)
            row.append(norm**2 / (1 + norm**2) * s / norm)
        poses.append(torch.stack(row))
    return torch.stack(poses)


# The squash functions take |s| as sqrt(|s|^2 + 1e-8), finite in its gradient at s = 0: about 1e-8 / (2 |s|)
# from the exact norm of the transcriptions.
SQUASH_EPS_EFFECT = 1e-7


def _same_values_and_gradients(ours, theirs, inputs, atol=1e-10):
    """Equal outputs, and equal gradients of a fixed random weighting of the outputs w.r.t. every input."""
    weights = [torch.randn(t.shape, generator=torch.Generator().manual_seed(7), dtype=t.dtype) for t in ours]
    for mine, reference in zip(ours, theirs, strict=True):
        torch.testing.assert_close(mine, reference, atol=atol, rtol=1e-9)
    grads_ours = torch.autograd.grad(sum((w * t).sum() for w, t in zip(weights, ours, strict=True)), inputs)
    grads_theirs = torch.autograd.grad(sum((w * t).sum() for w, t in zip(weights, theirs, strict=True)), inputs)
    for mine, reference in zip(grads_ours, grads_theirs, strict=True):
        torch.testing.assert_close(mine, reference, atol=atol, rtol=1e-9)


def test_self_routing_is_its_papers_equations_in_values_and_gradients():
    votes = _votes().requires_grad_()
    activations = torch.rand(B, I, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_()
    logits = torch.randn(B, I, J, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).requires_grad_()
    routed = self_routing(votes, activations, logits)
    _same_values_and_gradients(
        (routed.poses, routed.activations),
        transcribe_self_routing(votes, activations, logits),
        (votes, activations, logits),
    )


@pytest.mark.parametrize("iterations", [1, 2, 3])
@pytest.mark.parametrize("dim", [D, 1])
def test_attention_routing_is_its_papers_procedure_in_values_and_gradients(iterations, dim):
    """Against the transcription, at the test's pose size and at D = 1, where the official code skips the
    LayerNorm (which would map every 1-D pose to its bias: the net's output would ignore its input)."""
    votes = (_votes(offset=0.5)[..., :dim]).requires_grad_()
    generator = torch.Generator().manual_seed(3)
    norm_weight, norm_bias, score_weight = (
        torch.randn(dim, dtype=torch.float64, generator=generator).requires_grad_() for _ in range(3)
    )
    score_bias = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    parameters = (norm_weight, norm_bias, score_weight, score_bias)
    routed = attention_routing(votes, iterations, *parameters)
    used = parameters if dim > 1 else (score_weight, score_bias)  # no LayerNorm at D = 1
    _same_values_and_gradients(
        (routed.poses, routed.activations),
        transcribe_attention_routing(votes, iterations, *parameters),
        (votes, *used),
    )
    if dim == 1:  # the class scores follow the input
        other = attention_routing(votes.detach() + torch.randn_like(votes.detach()), iterations, *parameters)
        assert not torch.allclose(other.activations, routed.activations)


def test_efficient_routing_is_its_papers_equations_in_values_and_gradients():
    votes = (_votes() / 4).requires_grad_()
    log_priors = (
        0.1 * torch.randn(I, J, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    ).requires_grad_()
    routed = efficient_routing(votes, log_priors)
    torch.testing.assert_close(routed.assignment.sum(-1), torch.ones(B, I, dtype=torch.float64))  # c, without b
    _same_values_and_gradients(
        (routed.poses, routed.activations),
        (poses := transcribe_efficient_routing(votes, log_priors), poses.norm(dim=-1)),
        (votes, log_priors),
        atol=SQUASH_EPS_EFFECT,
    )


def test_uniform_routing_is_the_squashed_mean_vote_and_dynamic_routings_first_iteration():
    votes = _votes().requires_grad_()
    routed = uniform_routing(votes)
    _same_values_and_gradients((routed.poses,), (transcribe_uniform_routing(votes),), (votes,), atol=SQUASH_EPS_EFFECT)
    torch.testing.assert_close(routed.poses, dynamic_routing(votes.detach().contiguous(), _one_iteration()))
    assert torch.all(routed.assignment == 1 / J)


def _one_iteration():
    from capsexp.nn import DynamicRouting

    return DynamicRouting(iterations=1)


def test_random_couplings_are_each_childs_distribution_drawn_afresh_and_seedable():
    votes = _votes()
    first, second = random_routing(votes), random_routing(votes)
    torch.testing.assert_close(first.assignment.sum(-1), torch.ones(B, I, dtype=torch.float64))
    assert (first.assignment > 0).all() and not torch.equal(first.assignment, second.assignment)
    seeded = [random_routing(votes, torch.Generator().manual_seed(5)) for _ in range(2)]
    assert torch.equal(seeded[0].assignment, seeded[1].assignment)
    torch.testing.assert_close(seeded[0].poses, squash(torch.einsum("bij,bijd->bjd", seeded[0].assignment, votes)))


def test_self_routings_couplings_and_parent_activations_are_distributions():
    votes = _votes()
    activations = torch.rand(B, I, dtype=torch.float64)
    routed = self_routing(votes, activations, torch.randn(B, I, J, dtype=torch.float64))
    torch.testing.assert_close(routed.assignment.sum(-1), torch.ones(B, I, dtype=torch.float64))
    # sum_j a_j = sum_i a_i sum_j c_ij / sum_i a_i = 1: the children's activation shared out among the parents
    torch.testing.assert_close(routed.activations.sum(-1), torch.ones(B, dtype=torch.float64))
    # each pose a weighted mean of the votes: inside their range in every dimension
    assert (routed.poses <= votes.amax(dim=1) + 1e-12).all() and (routed.poses >= votes.amin(dim=1) - 1e-12).all()


def test_an_inactive_child_moves_no_parent_under_self_routing():
    votes, logits = _votes(), torch.randn(B, I, J, dtype=torch.float64)
    activations = torch.rand(B, I, dtype=torch.float64)
    activations[:, 0] = 0
    moved = votes.clone()
    moved[:, 0] += 100
    before, after = self_routing(votes, activations, logits), self_routing(moved, activations, logits)
    torch.testing.assert_close(before.poses, after.poses)


def test_attention_routing_starts_uniform_and_its_parents_are_layer_normalised():
    votes = _votes()
    once = attention_routing(votes, 1)
    assert torch.all(once.assignment == 1 / J)
    routed = attention_routing(votes, 3)
    torch.testing.assert_close(routed.assignment.sum(-1), torch.ones(B, I, dtype=torch.float64))
    torch.testing.assert_close(routed.poses.mean(-1), torch.zeros(B, J, dtype=torch.float64))
    torch.testing.assert_close(
        routed.poses.var(-1, unbiased=False), torch.full((B, J), 1 - 1e-5, dtype=torch.float64), atol=1e-4, rtol=0
    )
    assert torch.all(routed.activations == 0.5)  # no class-logit weights: no evidence either way


def test_attention_routing_sends_each_child_to_the_parent_its_vote_agrees_with():
    """Children 0-2 vote alike for parent 0 and at random elsewhere: after routing they lean to parent 0."""
    votes = _votes(spread=0.1)
    votes[:, :3, 0] = torch.tensor([3.0, -1.0, 2.0, 0.5], dtype=torch.float64)
    routed = attention_routing(votes, 3)
    assert (routed.assignment[:, :3, 0] > 1 / J).all()
    assert (routed.assignment[:, :3].argmax(-1) == 0).all()


def test_efficient_couplings_favour_votes_that_agree_with_the_others():
    votes = _votes(spread=0.1)
    votes[:, :4, 1] = torch.tensor([1.0, 1.0, -1.0, 0.5], dtype=torch.float64)  # 4 of 5 children agree on parent 1
    routed = efficient_routing(votes)
    torch.testing.assert_close(routed.assignment.sum(-1), torch.ones(B, I, dtype=torch.float64))
    assert (routed.assignment[:, :4].argmax(-1) == 1).all()
    assert (routed.activations < 1).all()


def test_efficient_squash_keeps_direction_has_unit_slope_at_zero_and_stays_below_one():
    s = torch.randn(64, D, dtype=torch.float64) * torch.logspace(-4, 2, 64, dtype=torch.float64).unsqueeze(-1)
    v = efficient_squash(s)
    torch.testing.assert_close(v.norm(dim=-1), 1 - torch.exp(-s.norm(dim=-1)), atol=1e-6, rtol=1e-6)
    assert (v.norm(dim=-1) < 1).all()
    torch.testing.assert_close(torch.nn.functional.cosine_similarity(v, s, dim=-1), torch.ones(64, dtype=torch.float64))
    zero = torch.zeros(1, D, dtype=torch.float64, requires_grad=True)
    assert torch.equal(efficient_squash(zero), torch.zeros(1, D, dtype=torch.float64))
    (gradient,) = torch.autograd.grad(efficient_squash(zero)[0, 0], zero)
    assert gradient[0, 0] == pytest.approx(1.0, rel=1e-3) and torch.isfinite(gradient).all()


ILL_CONDITIONED = {"offset": 30.0, "spread": 0.01}  # votes far from zero compared with their spread


@pytest.mark.parametrize(
    "name",
    ["uniform", "self", "attention", "efficient", "sinkhorn"],
)
def test_float32_stays_close_to_float64_on_ill_conditioned_votes(name):
    def route(votes):
        dtype = votes.dtype
        if name == "uniform":
            return uniform_routing(votes)
        if name == "self":
            generator = torch.Generator().manual_seed(1)
            activations = torch.rand(B, I, generator=generator, dtype=torch.float64).to(dtype)
            logits = torch.randn(B, I, J, generator=generator, dtype=torch.float64).to(dtype)
            return self_routing(votes, activations, logits)
        if name == "attention":
            return attention_routing(votes, 3, score_weight=torch.ones(D, dtype=dtype) / D)
        if name == "sinkhorn":
            masses = torch.rand(B, I, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype)
            return sinkhorn_routing(votes / 30, masses)
        return efficient_routing(votes / 30)

    single = route(votes := _votes(**ILL_CONDITIONED, dtype=torch.float32))
    exact = route(votes.double())  # the same inputs: what differs is float32 arithmetic
    for field in ("poses", "activations", "assignment"):
        error = (getattr(single, field).double() - getattr(exact, field)).abs().max().item()
        scale = getattr(exact, field).abs().max().item()
        assert error <= 1e-5 * max(scale, 1.0), f"{name} {field}: float32 off by {error:.2e}"


# ---- Sinkhorn routing (routing as optimal transport) ----------------------------------------------------


def transcribe_sinkhorn_routing(votes, masses, iterations, balance_iterations, epsilon):
    """Sinkhorn-Knopp in the probability domain, as the matrix-scaling algorithm is usually written: the
    kernel K = exp(b / eps), scalings u (children) and w (parents) alternately fitted to the marginals
    m_i = a_i / sum a and 1/J (w first, from 1), then one last u; the plan diag(u) K diag(w), its rows
    divided by m_i for the couplings. One example at a time; the routing around it as Procedure 1."""
    poses_out, couplings_out = [], []
    for n in range(votes.shape[0]):
        m = [masses[n, i] / sum(masses[n, k] for k in range(I)) for i in range(I)]
        b = [[votes.new_zeros(()) for _ in range(J)] for _ in range(I)]
        for r in range(iterations):
            if r == 0:
                c = [[votes.new_tensor(1 / J) for _ in range(J)] for _ in range(I)]
            else:
                kernel = [[torch.exp(b[i][j] / epsilon) for j in range(J)] for i in range(I)]
                w = [votes.new_ones(()) for _ in range(J)]
                for _ in range(balance_iterations):
                    u = [m[i] / sum(kernel[i][j] * w[j] for j in range(J)) for i in range(I)]
                    w = [(1 / J) / sum(kernel[i][j] * u[i] for i in range(I)) for j in range(J)]
                u = [m[i] / sum(kernel[i][j] * w[j] for j in range(J)) for i in range(I)]
                c = [[u[i] * kernel[i][j] * w[j] / m[i] for j in range(J)] for i in range(I)]
            s = [sum(c[i][j] * votes[n, i, j] for i in range(I)) for j in range(J)]
            v = [(_length(s[j]) ** 2 / (1 + _length(s[j]) ** 2)) * s[j] / _length(s[j]) for j in range(J)]
            if r < iterations - 1:
                b = [[b[i][j] + torch.dot(votes[n, i, j], v[j]) for j in range(J)] for i in range(I)]
        poses_out.append(torch.stack(v)), couplings_out.append(torch.stack([torch.stack(row) for row in c]))
    return torch.stack(poses_out), torch.stack(couplings_out)


@pytest.mark.parametrize(("iterations", "epsilon"), [(1, 1.0), (3, 1.0), (3, 0.25)])
def test_sinkhorn_routing_matches_its_probability_domain_transcription_values_and_gradients(iterations, epsilon):
    votes = _votes(spread=0.8).requires_grad_()
    masses = torch.rand(B, I, generator=torch.Generator().manual_seed(3), dtype=torch.float64).requires_grad_()
    routing = SinkhornRouting(iterations=iterations, balance_iterations=4, epsilon=epsilon)
    routed = sinkhorn_routing(votes, masses, routing)
    poses, couplings = transcribe_sinkhorn_routing(votes, masses, iterations, 4, epsilon)
    torch.testing.assert_close(routed.poses, poses, rtol=1e-6, atol=1e-9)  # squash's 1e-8 under the root
    torch.testing.assert_close(routed.assignment, couplings, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(routed.activations, poses.norm(dim=-1), rtol=1e-6, atol=1e-9)
    with torch.no_grad():  # evaluation's path, without the written-out backward pass
        evaluated = sinkhorn_routing(votes, masses, routing)
    for got, want in zip(evaluated, routed, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    upstream = torch.randn_like(poses)
    got = torch.autograd.grad((routed.poses * upstream).sum(), (votes, masses), allow_unused=True)
    want = torch.autograd.grad((poses * upstream).sum(), (votes, masses), allow_unused=True)
    for g, w in zip(got, want, strict=True):
        if w is None:  # one iteration: uniform couplings, the masses unused
            assert g is None or not g.abs().max()
        else:
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-7)


def _entropy(couplings: torch.Tensor) -> torch.Tensor:
    """A routing-entropy penalty: sum over children of -sum_j c_ij log c_ij."""
    return -(couplings * couplings.log()).sum()


@pytest.mark.parametrize(("iterations", "epsilon"), [(2, 1.0), (3, 0.25)])
def test_an_entropy_loss_on_sinkhorns_couplings_moves_the_votes_as_the_plain_procedure_does(iterations, epsilon):
    """A loss on the couplings returned (alone, and beside one on the poses) gives the votes and the masses
    the gradient of autograd through the plain procedure (float64, relative 1e-9), and that of the
    probability-domain transcription (to its squash's 1e-8 under the root)."""
    from capsexp.nn.functional._sinkhorn_routing import _route

    votes = _votes(spread=0.8, seed=2).requires_grad_()
    masses = torch.rand(B, I, generator=torch.Generator().manual_seed(4), dtype=torch.float64).requires_grad_()
    routing = SinkhornRouting(iterations=iterations, balance_iterations=4, epsilon=epsilon)
    upstream = torch.randn(B, J, D, generator=torch.Generator().manual_seed(5), dtype=torch.float64)

    def plain(votes, masses):  # the iterations on autograd's graph, without the written-out backward pass
        log_m = (masses / masses.sum(dim=1, keepdim=True)).log().unsqueeze(1)
        poses, couplings = _route(votes.transpose(1, 2).contiguous(), log_m, routing)[-1][2:]
        return poses, couplings.transpose(1, 2)

    routed = sinkhorn_routing(votes, masses, routing)
    for loss_of in (lambda p, c: _entropy(c), lambda p, c: _entropy(c) + (p * upstream).sum()):
        got = torch.autograd.grad(loss_of(routed.poses, routed.assignment), (votes, masses), retain_graph=True)
        want = torch.autograd.grad(loss_of(*plain(votes, masses)), (votes, masses))
        assert got[0].abs().amax() > 1e-3  # the loss on the couplings reaches the votes
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12)
        transcribed = transcribe_sinkhorn_routing(votes, masses, iterations, 4, epsilon)
        official = torch.autograd.grad(loss_of(*transcribed), (votes, masses))
        for g, w in zip(got, official, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-7)


def test_sinkhorn_couplings_sum_to_one_per_child_and_give_every_parent_the_same_mass():
    """The marginals: each child's couplings sum to 1 exactly; each parent's received mass sum_i m_i c_ij
    tends to 1/J. Votes that all agree with parent 0 would send dynamic routing's mass there; the
    transport cannot."""
    votes = _votes(spread=0.3)
    votes[:, :, 0] += 2.0  # every child's vote for parent 0 is long and alike
    masses = torch.rand(B, I, generator=torch.Generator().manual_seed(4), dtype=torch.float64) + 0.1
    routed = sinkhorn_routing(votes, masses, SinkhornRouting(iterations=3, balance_iterations=200))
    c = routed.assignment
    torch.testing.assert_close(c.sum(dim=-1), torch.ones(B, I, dtype=torch.float64), rtol=0, atol=1e-12)
    m = masses / masses.sum(dim=1, keepdim=True)
    received = torch.einsum("bi,bij->bj", m, c)
    torch.testing.assert_close(received, torch.full((B, J), 1 / J, dtype=torch.float64), rtol=0, atol=1e-8)
    _, dynamic = dynamic_routing(votes.transpose(1, 2).contiguous().transpose(1, 2), return_couplings=True)
    assert torch.einsum("bi,bij->bj", m, dynamic)[:, 0].min() > 1.5 / J  # dynamic routing's parent 0 takes more


def test_sinkhorn_logits_beyond_float32s_kernel_give_the_float64_plan(monkeypatch):
    """Votes whose agreements set some parent tens of nats below every child's best: float32's kernel
    exp(b) underflows there, float64's does not. The float32 routing (balanced in the log domain then)
    gives the float64 transcription's couplings and poses."""
    votes = _votes(spread=3.0, seed=5)
    votes[:, :, 0] *= 12.0  # parent 0's votes long: after one iteration every child agrees far more with it
    masses = torch.rand(B, I, generator=torch.Generator().manual_seed(6), dtype=torch.float64) + 0.1
    poses, couplings = transcribe_sinkhorn_routing(votes, masses, 3, 10, 0.25)
    log_domain_steps = []
    logsumexp = torch.logsumexp
    monkeypatch.setattr(torch, "logsumexp", lambda *a, **k: log_domain_steps.append(1) or logsumexp(*a, **k))
    routed = sinkhorn_routing(votes.float(), masses.float(), SinkhornRouting(iterations=3, epsilon=0.25))
    assert log_domain_steps  # the scaling domain was left
    assert couplings.min() < 1e-200  # float64 keeps what float32's kernel cannot hold
    torch.testing.assert_close(routed.assignment.double(), couplings, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(routed.poses.double(), poses, rtol=1e-4, atol=1e-6)


def test_sinkhorn_routing_with_equal_costs_is_uniform_and_stays_finite_on_huge_votes():
    votes = _votes().expand(B, I, J, D).clone()
    votes[:] = votes[:, :, :1]  # every parent gets the same vote from a child: equal costs
    routed = sinkhorn_routing(votes, torch.ones(B, I, dtype=torch.float64), SinkhornRouting())
    torch.testing.assert_close(routed.assignment, torch.full((B, I, J), 1 / J, dtype=torch.float64))
    huge = _votes(spread=1e4, dtype=torch.float32).requires_grad_()
    masses = torch.zeros(B, I)  # and children of mass 0
    routed = sinkhorn_routing(huge, masses, SinkhornRouting())
    (gradient,) = torch.autograd.grad(routed.poses.sum(), huge)
    assert all(torch.isfinite(t).all() for t in (*routed, gradient))
