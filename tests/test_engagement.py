"""Whether routing routes: the engagement measures against assignments worked out by hand."""

from __future__ import annotations

import math

import torch

from capsexp.nn.functional import predicted_share, responsibility_entropy, routing_engagement


def test_uniform_and_hard_assignments_are_the_two_ends():
    uniform = routing_engagement(torch.full((2, 3, 10), 0.1))
    assert torch.allclose(uniform.largest, torch.tensor(0.1)) and uniform.kl_from_uniform.abs().max() < 1e-6
    assert uniform.decided.sum() == 0
    hard = torch.zeros(2, 3, 10)
    hard[..., 7] = 1
    engaged = routing_engagement(hard)
    assert torch.equal(engaged.largest, torch.ones(2, 3)) and torch.equal(engaged.decided, torch.ones(2, 3))
    assert torch.allclose(engaged.kl_from_uniform, torch.tensor(math.log(10)))


def test_a_mild_preference_moves_the_kl_and_largest_share_where_the_entropy_hardly_moves():
    """0.15 to one of ten parents, the rest shared: entropy 0.998 of its maximum; KL and the largest
    share as computed by hand; not yet twice uniform."""
    mild = torch.full((1, 1, 10), 0.85 / 9)
    mild[..., 0] = 0.15
    engagement = routing_engagement(mild)
    by_hand = 0.15 * math.log(1.5) + 0.85 * math.log(0.85 / 9 * 10)
    assert responsibility_entropy(mild).item() > 0.99
    assert math.isclose(engagement.kl_from_uniform.item(), by_hand, rel_tol=1e-5)
    assert math.isclose(engagement.largest.item(), 0.15, rel_tol=1e-6) and engagement.decided.item() == 0
    mild[..., 0], mild[..., 1:] = 0.25, 0.75 / 9  # more than twice uniform
    assert routing_engagement(mild).decided.item() == 1


def test_a_convolutional_layout_gathers_each_childs_slots_first():
    """EM's (B, Q, M, J) with child_index: a child in two windows, its mass over both, judged over all
    the 2 x J parents that receive it."""
    child_index = torch.tensor([[0, 1], [1, 2]])  # child 1 in both windows
    assignment = torch.full((1, 2, 2, 3), 1 / 3)
    assignment[0, 0, 1] = torch.tensor([0.5, 0.0, 0.0])  # child 1's slot in window 0
    assignment[0, 1, 0] = torch.tensor([0.5, 0.0, 0.0])  # and in window 1: all its mass to two parents of six
    engagement = routing_engagement(assignment, child_index, 3)
    assert torch.allclose(engagement.largest, torch.tensor([[1 / 3, 0.5, 1 / 3]]))
    assert torch.allclose(engagement.kl_from_uniform, torch.tensor([[0.0, math.log(6) - math.log(2), 0.0]]), atol=1e-6)
    assert torch.equal(engagement.decided, torch.tensor([[0.0, 1.0, 0.0]]))


def test_the_predicted_share_is_each_childs_coupling_to_its_images_prediction():
    couplings = torch.tensor([[[0.7, 0.3], [0.4, 0.6]], [[0.5, 0.5], [0.2, 0.8]]])
    assert torch.equal(predicted_share(couplings, torch.tensor([0, 1])), torch.tensor([[0.7, 0.4], [0.5, 0.8]]))


def test_a_child_of_two_parents_is_decided_halfway_from_uniform_to_hard():
    """With 2 parents twice uniform is 1, which no coupling exceeds: the threshold is (1 + 1/2) / 2 = 0.75.
    With 3 and 10 parents it stays twice uniform (2/3 and 0.2)."""
    two = torch.tensor([[[0.7, 0.3], [0.8, 0.2], [0.5, 0.5], [0.2, 0.8]]])
    assert routing_engagement(two).decided.tolist() == [[0.0, 1.0, 0.0, 1.0]]
    three = torch.tensor([[[0.6, 0.2, 0.2], [0.7, 0.2, 0.1]]])
    assert routing_engagement(three).decided.tolist() == [[0.0, 1.0]]
    ten = torch.full((1, 2, 10), 0.8 / 9)
    ten[0, 0, 0], ten[0, 1] = 0.2, torch.tensor([0.21] + [0.79 / 9] * 9)
    assert routing_engagement(ten).decided.tolist() == [[0.0, 1.0]]


def test_couplings_that_do_not_sum_to_one_are_measured_as_each_childs_shares():
    """Max-min normalisation's couplings, each in [0, 1] on its own: child 0's (1, 0.5, 0.5, 0) are the
    shares (1/2, 1/4, 1/4, 0), entropy (ln 2 / 2 + ln 4 / 2) / ln 4 = 3/4, KL ln 4 - 3/4 ln 4 = ln 2 / 2,
    largest share 1/2 (not decided: not above twice uniform, 2/4); child 1's all at 1 are uniform. By hand."""
    couplings = torch.tensor([[[1.0, 0.5, 0.5, 0.0], [1.0, 1.0, 1.0, 1.0]]])
    engagement = routing_engagement(couplings)
    torch.testing.assert_close(engagement.largest, torch.tensor([[0.5, 0.25]]))
    torch.testing.assert_close(engagement.kl_from_uniform, torch.tensor([[math.log(2) / 2, 0.0]]), atol=1e-6, rtol=0)
    assert engagement.decided.tolist() == [[0.0, 0.0]]  # 1/2 is not above twice uniform, 2/4
    torch.testing.assert_close(responsibility_entropy(couplings), torch.tensor([[0.75, 1.0]]))
    torch.testing.assert_close(predicted_share(couplings, torch.tensor([1])), torch.tensor([[0.25, 0.25]]))
