"""squash, dynamic_routing and margin_loss against the paper (Sabour et al. 2017)."""

from __future__ import annotations

import math

import pytest
import torch

from capsexp.nn import DynamicRouting, RoutingCapsules
from capsexp.nn.functional import (
    dynamic_routing,
    dynamic_routing_trace,
    fully_connected_routing,
    margin_loss,
    squash,
)
from capsexp.nn.functional._dynamic_routing import _scratch


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


def procedure_1(
    votes: torch.Tensor,
    iterations: int,
    detach_agreement: bool = False,
    none_of_the_above: bool = False,
    logit_scale: float = 1.0,
):
    """Plain transcription of Procedure 1 with explicit loops over examples, children and parents; with
    ``none_of_the_above``, each child's softmax also over a last logit fixed at 0, whose share is dropped
    (section 7; the official code's leaky routing); each agreement times ``logit_scale`` (1: the paper)."""
    batch, children, parents, _ = votes.shape
    outputs, couplings = [], []
    for n in range(batch):
        b = [[votes.new_zeros(()) for _ in range(parents)] for _ in range(children)]
        for r in range(iterations):
            extra = [votes.new_zeros(())] if none_of_the_above else []
            c = [torch.softmax(torch.stack(b[i] + extra), dim=0)[:parents] for i in range(children)]
            s = [sum(c[i][j] * votes[n, i, j] for i in range(children)) for j in range(parents)]
            v = [paper_squash(s[j]) for j in range(parents)]
            if r < iterations - 1:
                for i in range(children):
                    for j in range(parents):
                        u = votes[n, i, j].detach() if detach_agreement else votes[n, i, j]
                        vj = v[j].detach() if detach_agreement else v[j]
                        b[i][j] = b[i][j] + logit_scale * torch.dot(u, vj)
        outputs.append(torch.stack(v))
        couplings.append(torch.stack(c))
    return torch.stack(outputs), torch.stack(couplings)


@pytest.mark.parametrize("iterations", [1, 2, 3, 4])
@pytest.mark.parametrize("detach_agreement", [False, True])
def test_routing_matches_procedure_1_values_and_gradients(iterations, detach_agreement):
    torch.manual_seed(iterations)
    votes = torch.randn(2, 6, 4, 3, dtype=torch.float64, requires_grad=True)
    v, c = dynamic_routing(votes, DynamicRouting(iterations, detach_agreement), return_couplings=True)
    v_ref, c_ref = procedure_1(votes, iterations, detach_agreement)
    assert torch.allclose(v, v_ref) and torch.allclose(c, c_ref)
    upstream = torch.randn_like(v)
    (grad,) = torch.autograd.grad(v, votes, upstream)
    (grad_ref,) = torch.autograd.grad(v_ref, votes, upstream)
    # Within the effect of squash's 1e-8 under the square root, which Eq. 1 as written lacks.
    assert torch.allclose(grad, grad_ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(("iterations", "none_of_the_above"), [(2, False), (3, False), (3, True)])
def test_an_entropy_loss_on_the_couplings_moves_the_votes_as_procedure_1_does(iterations, none_of_the_above):
    """A loss on the couplings returned (a routing-entropy penalty, alone and beside a loss on the
    parents) gives the votes the gradient of Procedure 1 on autograd's graph; where the couplings are
    constants (detach_agreement=true), a loss on them alone is refused, not answered with zeros."""
    torch.manual_seed(7)
    votes = torch.randn(2, 6, 4, 3, dtype=torch.float64, requires_grad=True)
    routing = DynamicRouting(iterations, none_of_the_above=none_of_the_above)
    v, c = dynamic_routing(votes, routing, return_couplings=True)
    v_ref, c_ref = procedure_1(votes, iterations, none_of_the_above=none_of_the_above)
    upstream = torch.randn_like(v)

    def entropy(c):
        return -(c * c.log()).sum()

    for loss_of in (lambda v, c: entropy(c), lambda v, c: entropy(c) + (v * upstream).sum()):
        (grad,) = torch.autograd.grad(loss_of(v, c), votes, retain_graph=True)
        (grad_ref,) = torch.autograd.grad(loss_of(v_ref, c_ref), votes, retain_graph=True)
        assert grad.abs().max() > 1e-3
        torch.testing.assert_close(grad, grad_ref, rtol=1e-5, atol=1e-7)  # squash's 1e-8 under the root
    _, detached = dynamic_routing(votes, DynamicRouting(iterations, True), return_couplings=True)
    with pytest.raises(RuntimeError, match="does not require grad"):
        torch.autograd.grad(entropy(detached), votes)


@pytest.mark.parametrize("iterations", [1, 3])
def test_the_routing_trace_records_each_iterations_couplings_and_changes(iterations):
    torch.manual_seed(0)
    votes = torch.randn(2, 6, 4, 3, dtype=torch.float64)
    trace = dynamic_routing_trace(votes, DynamicRouting(iterations))
    assert trace.couplings.shape == (iterations, 2, 6, 4)
    assert torch.allclose(trace.couplings.sum(dim=-1), torch.ones(iterations, 2, 6, dtype=torch.float64))
    agreements = []
    for r in range(1, iterations + 1):  # each iteration's couplings are those of a run stopped there
        parents, couplings = procedure_1(votes, r)
        assert torch.allclose(trace.couplings[r - 1], couplings)
        agreements.append(torch.einsum("bijd,bjd->bij", votes, parents))  # the update b_ij += u_hat_j|i . v_j
        assert trace.logit_changes[r - 1].item() == pytest.approx(agreements[-1].abs().mean().item(), rel=1e-5)
    updates = [(agreements[r] - agreements[r - 1]).abs().mean().item() for r in range(1, iterations)]
    assert trace.update_changes.tolist() == pytest.approx(updates, rel=1e-5)
    expected = [(trace.couplings[r] - trace.couplings[r - 1]).abs().mean().item() for r in range(1, iterations)]
    assert trace.coupling_changes.tolist() == pytest.approx(expected, rel=1e-5)


def test_the_traced_logit_change_is_the_change_the_scaled_update_makes():
    """b_ij += s u_hat_j|i . v_j: the first iteration's parents do not depend on s (c = 1/J), so the first
    logged change at s = 20 is 20 times the agreement, and every later one is the scaled agreement of
    its own parents."""
    torch.manual_seed(1)
    votes = torch.randn(2, 6, 4, 3, dtype=torch.float64)
    plain = dynamic_routing_trace(votes, DynamicRouting(3))
    scaled = dynamic_routing_trace(votes, DynamicRouting(3, logit_scale=20.0))
    assert scaled.logit_changes[0].item() == pytest.approx(20 * plain.logit_changes[0].item(), rel=1e-6)
    couplings = scaled.couplings[1]  # iteration 2's, from b = 20 (u_hat . v^(1))
    parents = squash(torch.einsum("bij,bijd->bjd", couplings, votes))
    agreement = torch.einsum("bijd,bjd->bij", votes, parents)
    assert scaled.logit_changes[1].item() == pytest.approx(20 * agreement.abs().mean().item(), rel=1e-6)


def test_routing_settles_when_the_children_agree_on_a_parent():
    """Appendix A's observation: once the children's votes agree on one parent (an entity present),
    the change that each iteration's logit update makes falls from iteration 2 on, about
    geometrically (the paper: almost linearly in log scale). The logit change itself, the agreement
    u_hat . v added each time, tends to a constant, not to 0."""
    torch.manual_seed(0)
    votes = 0.05 * torch.randn(4, 64, 10, 16, dtype=torch.float64)
    votes[:, :, 0] += 0.2 * torch.randn(4, 1, 16, dtype=torch.float64)  # every child agrees on parent 0
    trace = dynamic_routing_trace(votes, DynamicRouting(8))
    updates = trace.update_changes
    assert (updates[1:] < 0.7 * updates[:-1]).all(), updates
    assert updates[-1] < 0.05 * updates[0]
    assert trace.logit_changes[-1] > 0.9 * trace.logit_changes[1]


def test_one_iteration_is_the_squashed_mean_vote_exactly_in_float64():
    """c = softmax(0) = 1/J: with ten parents (1/10 is not exact in float32) a float64 run that
    passed through float32 would be off by 1e-8."""
    votes = torch.randn(2, 6, 10, 3, dtype=torch.float64)
    torch.testing.assert_close(
        dynamic_routing(votes, DynamicRouting(1)), squash(votes.sum(dim=1) / 10), rtol=1e-12, atol=1e-15
    )


def test_defaults_are_the_papers_three_iterations_with_learning_couplings():
    torch.manual_seed(0)
    votes = torch.randn(2, 6, 4, 3, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(2, 4, 3, dtype=torch.float64)
    (default,) = torch.autograd.grad(dynamic_routing(votes), votes, upstream)
    (paper,) = torch.autograd.grad(dynamic_routing(votes, DynamicRouting(3, False)), votes, upstream)
    assert torch.equal(default, paper)
    inputs = torch.randn(2, 6, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(6, 5, 4 * 3, dtype=torch.float64)
    (default,) = torch.autograd.grad(fully_connected_routing(inputs, weight, 4), inputs, upstream)
    (paper,) = torch.autograd.grad(
        fully_connected_routing(inputs, weight, 4, DynamicRouting(3, False)), inputs, upstream
    )
    assert torch.equal(default, paper)


@pytest.mark.parametrize("detach_agreement", [False, True])
def test_a_routing_logit_scale_matches_its_transcription_and_sharpens_the_couplings(detach_agreement):
    torch.manual_seed(5)
    votes = (0.3 * torch.randn(2, 6, 4, 3, dtype=torch.float64)).requires_grad_()
    routing = DynamicRouting(3, detach_agreement, logit_scale=20.0)
    v, c = dynamic_routing(votes, routing, return_couplings=True)
    v_ref, c_ref = procedure_1(votes, 3, detach_agreement, logit_scale=20.0)
    assert torch.allclose(v, v_ref) and torch.allclose(c, c_ref)
    upstream = torch.randn_like(v)
    (grad,) = torch.autograd.grad(v, votes, upstream)
    (grad_ref,) = torch.autograd.grad(v_ref, votes, upstream)
    assert torch.allclose(grad, grad_ref, rtol=1e-5, atol=1e-7)
    # Fused with the votes: the same gradients of the inputs and W.
    inputs = torch.randn(3, 7, 5, dtype=torch.float64, requires_grad=True)
    weight = (0.3 * torch.randn(7, 5, 4 * 3, dtype=torch.float64)).requires_grad_()
    fused = fully_connected_routing(inputs, weight, 4, routing)
    unfused = dynamic_routing(torch.einsum("bip,ipq->biq", inputs, weight).view(3, 7, 4, 3), routing)
    torch.testing.assert_close(fused, unfused, rtol=1e-12, atol=1e-14)
    for got, want in zip(
        torch.autograd.grad((fused * fused).sum(), (inputs, weight)),
        torch.autograd.grad((unfused * unfused).sum(), (inputs, weight)),
        strict=True,
    ):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    # A larger scale moves the couplings further from uniform (1/J), on the same votes.
    _, c_paper = dynamic_routing(votes, DynamicRouting(3, detach_agreement), return_couplings=True)
    assert (c - 1 / 4).abs().mean() > 5 * (c_paper - 1 / 4).abs().mean()


@pytest.mark.parametrize("iterations", [1, 3])
def test_the_none_of_the_above_category_matches_its_transcription_and_takes_a_share_of_each_child(iterations):
    torch.manual_seed(iterations)
    votes = torch.randn(2, 6, 4, 3, dtype=torch.float64, requires_grad=True)
    routing = DynamicRouting(iterations, none_of_the_above=True)
    v, c = dynamic_routing(votes, routing, return_couplings=True)
    v_ref, c_ref = procedure_1(votes, iterations, none_of_the_above=True)
    assert torch.allclose(v, v_ref) and torch.allclose(c, c_ref)
    assert (c.sum(dim=-1) < 1).all()  # the rest went to the dropped category
    if iterations == 1:
        assert torch.allclose(c, torch.full_like(c, 1 / 5))  # 1 / (J + 1)
    upstream = torch.randn_like(v)
    (grad,) = torch.autograd.grad(v, votes, upstream)
    (grad_ref,) = torch.autograd.grad(v_ref, votes, upstream)
    assert torch.allclose(grad, grad_ref, rtol=1e-5, atol=1e-7)
    # Fused with the votes, the same parents and gradients.
    inputs = torch.randn(3, 7, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(7, 5, 4 * 3, dtype=torch.float64, requires_grad=True)
    fused = fully_connected_routing(inputs, weight, 4, routing)
    unfused = dynamic_routing(torch.einsum("bip,ipq->biq", inputs, weight).view(3, 7, 4, 3), routing)
    torch.testing.assert_close(fused, unfused, rtol=1e-12, atol=1e-14)
    got = torch.autograd.grad(fused.sum(), (inputs, weight))
    want = torch.autograd.grad(unfused.sum(), (inputs, weight))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("iterations", [1, 3])
@pytest.mark.parametrize("detach_agreement", [False, True])
def test_fused_routing_equals_votes_then_routing(iterations, detach_agreement):
    torch.manual_seed(iterations)
    inputs = torch.randn(3, 7, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(7, 5, 4 * 3, dtype=torch.float64, requires_grad=True)
    fused = fully_connected_routing(inputs, weight, 4, DynamicRouting(iterations, detach_agreement))
    votes = torch.einsum("bip,ipq->biq", inputs, weight).view(3, 7, 4, 3)  # u_hat_j|i = W_ij u_i
    unfused = dynamic_routing(votes, DynamicRouting(iterations, detach_agreement))
    torch.testing.assert_close(fused, unfused, rtol=1e-12, atol=1e-14)
    upstream = torch.randn_like(fused)
    got = torch.autograd.grad(fused, (inputs, weight), upstream)
    want = torch.autograd.grad(unfused, (inputs, weight), upstream)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_fused_routing_promotes_mixed_dtypes():
    inputs, weight = torch.randn(2, 6, 5), torch.randn(6, 5, 12, dtype=torch.float64)
    assert fully_connected_routing(inputs, weight, 4).dtype == torch.float64


def test_cpu_scratch_buffer_is_reused_not_reallocated():
    """The fused layer's temporaries reuse one buffer per thread and dtype on the CPU (a fresh one
    each step costs its page faults)."""
    like = torch.zeros(1)
    first = _scratch((4, 5), like).data_ptr()
    assert _scratch((4, 5), like).data_ptr() == first  # same size
    assert _scratch((3, 2), like).data_ptr() == first  # smaller
    assert _scratch((2, 3), like.double()).data_ptr() != first  # another dtype, another buffer
    assert _scratch((4, 5), like).data_ptr() == first  # ...which leaves the first in place
    assert _scratch((40, 50), like).shape == (40, 50)  # grown on demand
    # Off the CPU (the meta device standing in for CUDA): a plain new tensor on that device.
    elsewhere = _scratch((4, 5), torch.zeros(1, device="meta"))
    assert elsewhere.device.type == "meta" and elsewhere.shape == (4, 5)


def test_routing_backward_passes_gradcheck():
    votes = torch.randn(2, 5, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: dynamic_routing(x, DynamicRouting(3)), (votes,))


def test_couplings_sum_to_one_over_parents_and_start_uniform():
    votes = torch.randn(4, 30, 10, 16)
    _, couplings = dynamic_routing(votes, DynamicRouting(3), return_couplings=True)
    assert couplings.shape == (4, 30, 10)
    assert torch.allclose(couplings.sum(dim=2), torch.ones(4, 30), atol=1e-6)
    assert not torch.allclose(couplings, torch.full_like(couplings, 0.1))  # routing moved them
    _, uniform = dynamic_routing(votes, DynamicRouting(1), return_couplings=True)
    assert torch.allclose(uniform, torch.full_like(uniform, 0.1))


def test_routing_is_invariant_to_permuting_the_children():
    votes = torch.randn(3, 40, 10, 16)
    permutation = torch.randperm(40)
    assert torch.allclose(
        dynamic_routing(votes, DynamicRouting(3)), dynamic_routing(votes[:, permutation], DynamicRouting(3)), atol=1e-5
    )


def test_routing_outputs_are_capsules():
    v = dynamic_routing(torch.randn(2, 50, 10, 16) * 10, DynamicRouting(3))
    assert v.shape == (2, 10, 16) and (v.norm(dim=-1) < 1).all()


def test_routing_rejects_bad_input():
    with pytest.raises(ValueError, match="votes must have shape"):
        dynamic_routing(torch.randn(2, 3, 4), DynamicRouting(3))
    # The options' ranges are DynamicRouting's, checked once, when it is built.
    with pytest.raises(ValueError, match=r"^DynamicRouting: iterations=0: must be greater than 0$"):
        DynamicRouting(iterations=0)


def test_fused_layer_matches_votes_then_routing_with_interleaved_calls():
    """The fused layer reuses one CPU scratch buffer per thread: calls of layers of different sizes,
    several forwards before any backward (gradient accumulation), must still give the unfused
    gradients."""
    torch.manual_seed(0)
    small = RoutingCapsules(in_caps=40, in_dim=8, out_caps=10, out_dim=16)
    large = RoutingCapsules(in_caps=72, in_dim=8, out_caps=10, out_dim=16)
    inputs = [torch.randn(3, 40, 8, requires_grad=True), torch.randn(5, 72, 8, requires_grad=True)]
    parents = [small(inputs[0]).poses, large(inputs[1]).poses, small(inputs[0] * 2).poses]
    sum(p.pow(2).sum() for p in parents).backward()
    fused = [small.weight.grad, large.weight.grad, inputs[0].grad, inputs[1].grad]

    small.weight.grad = large.weight.grad = inputs[0].grad = inputs[1].grad = None
    reference = [
        dynamic_routing(small.votes(inputs[0]), DynamicRouting(3)),
        dynamic_routing(large.votes(inputs[1]), DynamicRouting(3)),
        dynamic_routing(small.votes(inputs[0] * 2), DynamicRouting(3)),
    ]
    for got, want in zip(parents, reference, strict=True):
        torch.testing.assert_close(got, want)
    sum(p.pow(2).sum() for p in reference).backward()
    for got, want in zip(fused, [small.weight.grad, large.weight.grad, inputs[0].grad, inputs[1].grad], strict=True):
        torch.testing.assert_close(got, want)


def test_a_routing_layer_computes_in_float32_under_bf16_autocast():
    """Votes and routing stay float32 under autocast: the layer gives what it gives without autocast."""
    torch.manual_seed(0)
    layer = RoutingCapsules(in_caps=72, in_dim=8, out_caps=10, out_dim=16)
    inputs = torch.randn(4, 72, 8, requires_grad=True)
    results = []
    for enabled in (False, True):
        layer.zero_grad(), setattr(inputs, "grad", None)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            parents = layer(inputs).poses
        parents.norm(dim=-1).sum().backward()
        results.append((parents.detach(), layer.weight.grad.clone(), inputs.grad.clone()))
    assert results[1][0].dtype == torch.float32
    for exact, under_autocast in zip(*results, strict=True):
        torch.testing.assert_close(under_autocast, exact, rtol=0, atol=0)
    # bf16 inputs (a bf16 convolution's output) are routed in float32 too
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(inputs.detach().bfloat16()).poses.dtype == torch.float32


def test_bf16_votes_keep_their_dtype_and_route_with_a_float32_state():
    """The routing state (b, c, s, v) is small: it stays float32 for bf16 votes, so that the
    couplings sum to 1 to float32 precision and the routed capsules are as close to exact routing
    as the votes' own rounding allows (a bf16 state roughly triples the error)."""
    torch.manual_seed(0)
    votes = (0.3 * torch.randn(4, 64, 10, 16)).bfloat16().requires_grad_()
    parents, couplings = dynamic_routing(votes, DynamicRouting(3), return_couplings=True)
    assert parents.dtype == torch.bfloat16
    torch.testing.assert_close(couplings.sum(dim=-1), torch.ones(4, 64), rtol=0, atol=1e-6)
    _, uniform = dynamic_routing(votes, DynamicRouting(1), return_couplings=True)  # 1/10, not bf16's 0.1001
    torch.testing.assert_close(uniform.sum(dim=-1), torch.ones(4, 64), rtol=0, atol=1e-6)
    exact_votes = votes.detach().double().requires_grad_()
    exact = dynamic_routing(exact_votes, DynamicRouting(3))
    assert (parents.double() - exact).norm(dim=-1).max() < 0.007 * exact.norm(dim=-1).max()  # 0.004 here
    upstream = torch.randn(4, 10, 16).bfloat16()
    (grad,) = torch.autograd.grad(parents, votes, upstream)
    (exact_grad,) = torch.autograd.grad(exact, exact_votes, upstream.double())
    assert (grad.double() - exact_grad).norm() < 0.005 * exact_grad.norm()  # 0.003 here


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


def test_a_net_first_run_under_inference_mode_still_trains_and_differentiates():
    # A test-only run (Lightning tests under inference mode) followed by an attack or more training:
    # the routing's reused CPU buffers must not be inference tensors.
    layer = RoutingCapsules(in_caps=30, in_dim=4, out_caps=5, out_dim=6)
    with torch.inference_mode():
        layer(torch.randn(3, 30, 4))
    inputs = torch.randn(3, 30, 4, requires_grad=True)
    layer(inputs).poses.sum().backward()
    assert inputs.grad.abs().sum() > 0
