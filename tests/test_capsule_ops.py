"""squash, dynamic_routing and margin_loss against the paper (Sabour et al. 2017)."""

from __future__ import annotations

import math

import pytest
import torch

from capsexp.nn import RoutingCapsules
from capsexp.nn.functional import dynamic_routing, margin_loss, squash


# ---- squash (Eq. 1) ---------------------------------------------------------------------------
def test_squash_length_below_one_and_direction_kept():
    direction = torch.nn.functional.normalize(torch.randn(64, 16), dim=-1)
    s = direction * torch.logspace(-3, 2, 64)[:, None]
    v = squash(s)
    assert (v.norm(dim=-1) < 1).all()
    # Past |s| ~ 1e3, |s|^2 / (1 + |s|^2) rounds to 1 in float32: never above it.
    assert (squash(direction * 1e6).norm(dim=-1) <= 1 + 1e-6).all()
    assert torch.allclose(torch.cosine_similarity(v, s, dim=-1), torch.ones(64), atol=1e-5)
    # |s| = 1 -> |v| = 1 / (1 + 1) = 0.5
    assert squash(torch.tensor([[0.6, 0.8]])).norm().item() == pytest.approx(0.5, abs=1e-6)


def test_squash_zero_gives_zero_with_a_finite_gradient():
    s = torch.zeros(3, 8, requires_grad=True)
    v = squash(s)
    assert torch.equal(v, torch.zeros(3, 8))
    v.sum().backward()
    assert torch.isfinite(s.grad).all()


def test_squash_along_another_dim():
    s = torch.randn(4, 8, 5)
    assert torch.allclose(squash(s, dim=1), squash(s.transpose(1, 2)).transpose(1, 2), atol=1e-6)


# ---- dynamic routing (Procedure 1) --------------------------------------------------------------
def paper_squash(s: torch.Tensor) -> torch.Tensor:
    """Eq. 1 as written, v = |s|^2 / (1 + |s|^2) s / |s| (no safeguard at 0: the votes here are not 0)."""
    squared_norm = torch.dot(s, s)
    return squared_norm / (1 + squared_norm) * s / torch.sqrt(squared_norm)


def procedure_1(votes: torch.Tensor, iterations: int, detach_agreement: bool = False):
    """Plain transcription of Procedure 1 with explicit loops over examples, children and parents."""
    batch, children, parents, _ = votes.shape
    outputs, couplings = [], []
    for n in range(batch):
        b = [[votes.new_zeros(()) for _ in range(parents)] for _ in range(children)]
        for r in range(iterations):
            c = [torch.softmax(torch.stack(b[i]), dim=0) for i in range(children)]
            s = [sum(c[i][j] * votes[n, i, j] for i in range(children)) for j in range(parents)]
            v = [paper_squash(s[j]) for j in range(parents)]
            if r < iterations - 1:
                for i in range(children):
                    for j in range(parents):
                        u = votes[n, i, j].detach() if detach_agreement else votes[n, i, j]
                        vj = v[j].detach() if detach_agreement else v[j]
                        b[i][j] = b[i][j] + torch.dot(u, vj)
        outputs.append(torch.stack(v))
        couplings.append(torch.stack(c))
    return torch.stack(outputs), torch.stack(couplings)


@pytest.mark.parametrize("iterations", [1, 2, 3, 4])
@pytest.mark.parametrize("detach_agreement", [False, True])
def test_routing_matches_procedure_1_values_and_gradients(iterations, detach_agreement):
    torch.manual_seed(iterations)
    votes = torch.randn(2, 6, 4, 3, dtype=torch.float64, requires_grad=True)
    v, c = dynamic_routing(votes, iterations, return_couplings=True, detach_agreement=detach_agreement)
    v_ref, c_ref = procedure_1(votes, iterations, detach_agreement)
    assert torch.allclose(v, v_ref) and torch.allclose(c, c_ref)
    upstream = torch.randn_like(v)
    (grad,) = torch.autograd.grad(v, votes, upstream)
    (grad_ref,) = torch.autograd.grad(v_ref, votes, upstream)
    # Within the effect of squash's 1e-8 under the square root, which Eq. 1 as written lacks.
    assert torch.allclose(grad, grad_ref, rtol=1e-5, atol=1e-7)


def test_routing_backward_passes_gradcheck():
    votes = torch.randn(2, 5, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: dynamic_routing(x, 3), (votes,))


def test_couplings_sum_to_one_over_parents_and_start_uniform():
    votes = torch.randn(4, 30, 10, 16)
    _, couplings = dynamic_routing(votes, 3, return_couplings=True)
    assert couplings.shape == (4, 30, 10)
    assert torch.allclose(couplings.sum(dim=2), torch.ones(4, 30), atol=1e-6)
    assert not torch.allclose(couplings, torch.full_like(couplings, 0.1))  # routing moved them
    _, uniform = dynamic_routing(votes, 1, return_couplings=True)
    assert torch.allclose(uniform, torch.full_like(uniform, 0.1))


def test_routing_is_invariant_to_permuting_the_children():
    votes = torch.randn(3, 40, 10, 16)
    permutation = torch.randperm(40)
    assert torch.allclose(dynamic_routing(votes, 3), dynamic_routing(votes[:, permutation], 3), atol=1e-5)


def test_routing_outputs_are_capsules():
    v = dynamic_routing(torch.randn(2, 50, 10, 16) * 10, 3)
    assert v.shape == (2, 10, 16) and (v.norm(dim=-1) < 1).all()


def test_routing_rejects_bad_input():
    with pytest.raises(ValueError, match="votes must have shape"):
        dynamic_routing(torch.randn(2, 3, 4), 3)
    with pytest.raises(ValueError, match="at least one iteration"):
        dynamic_routing(torch.randn(2, 3, 4, 5), 0)


def test_fused_layer_matches_votes_then_routing_with_interleaved_calls():
    """The fused layer reuses one CPU scratch buffer per thread: calls of layers of different sizes,
    several forwards before any backward (gradient accumulation), must still give the unfused
    gradients."""
    torch.manual_seed(0)
    small = RoutingCapsules(in_caps=40, in_dim=8, out_caps=10, out_dim=16)
    large = RoutingCapsules(in_caps=72, in_dim=8, out_caps=10, out_dim=16)
    inputs = [torch.randn(3, 40, 8, requires_grad=True), torch.randn(5, 72, 8, requires_grad=True)]
    parents = [small(inputs[0]), large(inputs[1]), small(inputs[0] * 2)]
    sum(p.pow(2).sum() for p in parents).backward()
    fused = [small.weight.grad, large.weight.grad, inputs[0].grad, inputs[1].grad]

    small.weight.grad = large.weight.grad = inputs[0].grad = inputs[1].grad = None
    reference = [
        dynamic_routing(small.votes(inputs[0]), 3),
        dynamic_routing(large.votes(inputs[1]), 3),
        dynamic_routing(small.votes(inputs[0] * 2), 3),
    ]
    for got, want in zip(parents, reference, strict=True):
        torch.testing.assert_close(got, want)
    sum(p.pow(2).sum() for p in reference).backward()
    for got, want in zip(fused, [small.weight.grad, large.weight.grad, inputs[0].grad, inputs[1].grad], strict=True):
        torch.testing.assert_close(got, want)


def test_routing_is_finite_under_bf16_autocast():
    layer = RoutingCapsules(in_caps=72, in_dim=8, out_caps=10, out_dim=16)
    inputs = torch.randn(4, 72, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        parents = layer(inputs)
    parents.float().norm(dim=-1).sum().backward()
    assert torch.isfinite(parents.float()).all()
    assert torch.isfinite(layer.weight.grad).all() and torch.isfinite(inputs.grad).all()
    # bf16 votes given directly keep their dtype; the routing state stays float32.
    v = dynamic_routing(torch.randn(2, 20, 10, 16, dtype=torch.bfloat16), 3)
    assert v.dtype == torch.bfloat16 and torch.isfinite(v.float()).all()


# ---- margin loss (Eq. 4) ------------------------------------------------------------------------
def test_margin_loss_hand_computed():
    lengths = torch.tensor([[0.95, 0.05, 0.30], [0.50, 0.20, 0.00]])
    targets = torch.tensor([0, 1])
    # example 0: present 0.95 >= 0.9 -> 0; absent 0.05 <= 0.1 -> 0; absent 0.30 -> 0.5 * 0.2^2 = 0.02
    # example 1: absent 0.50 -> 0.5 * 0.4^2 = 0.08; present 0.20 -> 0.7^2 = 0.49; absent 0 -> 0
    expected = (0.02 + 0.08 + 0.49) / 2
    assert margin_loss(lengths, targets).item() == pytest.approx(expected, abs=1e-6)
    assert margin_loss(lengths, targets, lambda_=0.0).item() == pytest.approx(0.49 / 2, abs=1e-6)


def test_margin_loss_is_zero_for_perfect_capsules():
    lengths = torch.full((3, 10), 0.05)
    lengths[torch.arange(3), torch.tensor([2, 5, 7])] = 0.99
    assert margin_loss(lengths, torch.tensor([2, 5, 7])).item() == 0.0
    assert math.isclose(
        margin_loss(lengths, torch.tensor([3, 5, 7])).item(), (0.85**2 + 0.5 * 0.89**2) / 3, rel_tol=1e-5
    )
