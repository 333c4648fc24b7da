"""Routing as a swappable part: every algorithm in CapsNet's place (``model=capsnet model/routing=<name>``)
trains from the command line, and each router returns what the class scores and diagnostics read; what
a model costs, as a run reports it."""

from __future__ import annotations

import math

import pytest
import torch

from capsexp.config.routing_registry import built_in
from capsexp.lit import ActivationNLL
from capsexp.models import CapsNet
from capsexp.nn import AttentionRouting, DynamicRouting, RoutingCapsules
from capsexp.run.model_cost import forward_flops_per_image
from tests.helpers import TINY_RUN, load_events, run_cli_in_process, scalars

ROUTINGS = built_in()  # capsexp's own, whatever else is installed


@pytest.mark.parametrize("name", list(ROUTINGS))
def test_every_router_gives_activations_in_0_1_an_assignment_and_gradients_to_all_its_parameters(name):
    torch.manual_seed(0)
    layer = RoutingCapsules(in_caps=12, in_dim=8, out_caps=4, out_dim=6, routing=ROUTINGS[name])
    children = torch.randn(3, 12, 8) * 0.3
    routed = layer.router(layer.votes(children), children, children.norm(dim=-1))
    assert routed.poses.shape == (3, 4, 6) and routed.activations.shape == (3, 4)
    assert ((routed.activations >= 0) & (routed.activations <= 1)).all()
    assert routed.assignment.shape == (3, 12, 4)
    (routed.activations.sum() + routed.poses.pow(2).sum()).backward()
    for parameter_name, parameter in layer.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), parameter_name
    # The layer's forward gives the same parents (dynamic routing's fused path included).
    torch.manual_seed(1)
    again = layer(children)
    if name != "random":  # drawn afresh at every pass
        torch.testing.assert_close(again.poses, routed.poses, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(again.activations, routed.activations, atol=1e-6, rtol=1e-5)


def test_dynamic_routings_activations_are_its_capsules_lengths():
    layer = RoutingCapsules(in_caps=12, in_dim=8, out_caps=4, out_dim=6, routing=DynamicRouting())
    routed = layer(torch.randn(3, 12, 8))
    torch.testing.assert_close(routed.activations, routed.poses.norm(dim=-1))
    assert routed.assignment is None  # fused: the couplings are not kept


def test_dynamic_routing_runs_fused_unwatched_and_shows_a_watcher_its_couplings(monkeypatch):
    """Unwatched, the layer takes the router's fused path alone (the votes' routing is not called); watched,
    the router also routes the votes and the watcher sees their couplings, the parents the same; the watch
    removed, the fused path alone again. A router without a fused path says so."""
    from capsexp.nn import routers

    calls = []

    def spied(function):
        def spy(*args, **kwargs):
            calls.append(function.__name__)
            return function(*args, **kwargs)

        return spy

    monkeypatch.setattr(routers, "fully_connected_routing", spied(routers.fully_connected_routing))
    monkeypatch.setattr(routers, "dynamic_routing", spied(routers.dynamic_routing))
    torch.manual_seed(0)
    layer = RoutingCapsules(in_caps=12, in_dim=8, out_caps=4, out_dim=6, routing=DynamicRouting())
    children = torch.randn(3, 12, 8)
    unwatched = layer(children)
    assert calls == ["fully_connected_routing"] and not routers.watched(layer.router)
    seen = []
    with routers.watch(layer.router, lambda module, args, output: seen.append(output)) as watching:
        assert routers.watched(layer.router)
        calls.clear()
        watched = layer(children)
    assert calls == ["fully_connected_routing", "dynamic_routing"]
    assert len(seen) == 1 and seen[0].assignment.shape == (3, 12, 4)
    torch.testing.assert_close(seen[0].assignment.sum(dim=-1), torch.ones(3, 12))
    torch.testing.assert_close(seen[0].poses, watched.poses)
    torch.testing.assert_close(watched.poses, unwatched.poses)
    assert watched.assignment is None  # the layer's own output is the fused path's
    watching.remove()  # a second removal changes nothing
    calls.clear()
    layer(children)
    assert calls == ["fully_connected_routing"] and not routers.watched(layer.router) and len(seen) == 1
    uniform = RoutingCapsules(in_caps=12, in_dim=8, out_caps=4, out_dim=6, routing=ROUTINGS["uniform"])
    assert uniform.router.fused_with_votes is None
    assert uniform(children).assignment is not None


# Two training steps, one validation and one test batch, the routing diagnostics at every step.
TWO_STEPS = [
    "trainer.max_steps=2",
    "trainer.val_check_interval=2",
    "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=1",
    "callbacks.routing_diagnostics.every_n_steps=1",
]


# Dynamic routing (fused), EM (a matrix router in CapsNet's place) and uniform coupling (no iterations) train
# from the command line in the fast suite, every routing in make test-slow; the contract tests run every
# routing's numerics in the fast suite.
FAST_ROUTINGS = ("dynamic", "em", "uniform")


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=[] if name in FAST_ROUTINGS else [pytest.mark.slow]) for name in ROUTINGS]
)
def test_capsnet_trains_with_every_routing_from_the_command_line(name, mnist_dir, tmp_path):
    result = run_cli_in_process(
        *TINY_RUN,
        f"paths.data_dir={mnist_dir}",
        "model=capsnet",
        f"model/routing={name}",
        "model.net.conv_channels=8",
        "model.net.primary_types=2",
        *TWO_STEPS,
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    logged = scalars(tmp_path)
    assert "test/acc" in logged and "train/margin_loss_step" in logged
    # The routing diagnostics, whatever the algorithm: how decided the assignment, how input-dependent the activations.
    assert [e.step for e in logged["routing/digits/entropy"]] == [0, 1]
    assert all(0 <= e.value <= 1 + 1e-6 for e in logged["routing/digits/entropy"])
    assert logged["routing/digits/activation_std_across_inputs"][0].value >= 0
    # Whether it routes, beside the entropy: shares in [1/J, 1], a KL from uniform of at least 0; and, after
    # testing, the share each child sends to the predicted class.
    classes = 10
    assert all(1 / classes - 1e-6 <= e.value <= 1 + 1e-6 for e in logged["routing/digits/largest_coupling"])
    assert all(e.value >= 0 for e in logged["routing/digits/kl_from_uniform"])
    assert all(0 <= e.value <= 1 for e in logged["routing/digits/decided_share"])
    assert 0 <= logged["routing/digits/test_predicted_share"][0].value <= 1
    # What routing did, whatever the algorithm: the weight of each primary capsule's vote per class.
    assert "routing/digits/couplings" in load_events(tmp_path, images=0).Tags()["images"]
    # How it settles over the iterations, for an algorithm that iterates.
    iterations = getattr(ROUTINGS[name], "iterations", 1)
    settles = "routing/digits/update_change_iter2" if name == "dynamic" else "routing/digits/pose_change_iter2"
    assert (settles in logged) == (iterations > 1)
    if iterations > 1:
        assert "routing/digits/coupling_change_iter2" in logged


def test_a_models_forward_flops_are_its_matrix_products_per_image_and_its_mode_is_kept():
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(2 * 5 * 5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    net.train()
    assert forward_flops_per_image(net, channels=2, image_size=5) == 2 * (50 * 7 + 7 * 3)  # 2 per multiply-add
    assert net.training


def test_the_fully_connected_head_has_digitcaps_size_and_the_same_outputs_shape():
    kwargs = dict(image_size=40, conv_channels=16, primary_types=4)
    capsules, plain = CapsNet(**kwargs), CapsNet(head="fully_connected", **kwargs)
    digits = sum(p.numel() for p in capsules.digits.parameters())
    head = sum(p.numel() for p in plain.digits.parameters())
    # W_ij's I in_dim J D weights, against the head's first layer (as many, plus J D biases) and its J D J + J logits.
    assert head == digits + 10 * 16 + 10 * 16 * 10 + 10
    images = torch.rand(3, 1, 40, 40)
    out = plain(images, targets=torch.tensor([1, 2, 3]))
    assert out.scores.shape == (3, 10) and out.poses.shape == (3, 10, 16)
    assert ((out.scores > 0) & (out.scores < 1)).all()
    assert out.reconstructions.shape == (3, 1, 40, 40)


def test_pose_logits_are_one_linear_map_of_each_class_pose_shared_by_the_classes():
    net = CapsNet(conv_channels=8, primary_types=2, class_scores="pose_logits", reconstruction=False)
    out = net(torch.rand(2, 1, 28, 28))
    weight, bias = net.class_logit.weight[0], net.class_logit.bias[0]
    torch.testing.assert_close(out.scores, out.poses @ weight + bias)
    assert out.scores.shape == (2, 10)


def test_the_activation_nll_is_minus_the_log_of_the_targets_share_of_the_activations():
    activations = torch.tensor([[0.2, 0.6, 0.2], [0.1, 0.1, 0.3]], dtype=torch.float64)
    loss = ActivationNLL()(activations, images=None, targets=torch.tensor([1, 2]))
    expected = -(math.log(0.6 / 1.0) + math.log(0.3 / 0.5)) / 2
    assert loss["loss"].item() == pytest.approx(expected) and loss["nll"] is loss["loss"]


@pytest.mark.parametrize(
    ("overrides", "term"),
    [
        # Self-routing with its paper's loss, inverted dot-product attention routing with its paper's.
        (["model/routing=self", "model/loss=nll"], "train/nll_step"),
        (["model/routing=attention", "model/loss=cross_entropy"], "train/loss_step"),
        # The plain reference: no routing, no routing diagnostics.
        (["model.net.head=fully_connected"], "train/margin_loss_step"),
    ],
)
def test_capsnet_trains_with_each_papers_loss_and_with_the_plain_head(overrides, term, mnist_dir, tmp_path):
    result = run_cli_in_process(
        *TINY_RUN,
        f"paths.data_dir={mnist_dir}",
        "model=capsnet_small",
        *overrides,
        *TWO_STEPS,
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    logged = scalars(tmp_path)
    assert "test/acc" in logged and term in logged
    assert ("routing/digits/entropy" in logged) == ("model.net.head=fully_connected" not in overrides)


def test_routing_by_iteration_ends_where_the_layer_routes_and_leaves_its_options_as_they_were():
    torch.manual_seed(0)
    layer = RoutingCapsules(in_caps=12, in_dim=8, out_caps=4, out_dim=6, routing=AttentionRouting(iterations=3))
    children = torch.randn(3, 12, 8) * 0.3
    by_iteration = layer.routed_by_iteration(children)
    assert len(by_iteration) == 3 and layer.router.routing == AttentionRouting(iterations=3)
    torch.testing.assert_close(by_iteration[-1].poses, layer(children).poses)
    first = RoutingCapsules(in_caps=12, in_dim=8, out_caps=4, out_dim=6, routing=AttentionRouting(iterations=1))
    first.load_state_dict(layer.state_dict())
    torch.testing.assert_close(by_iteration[0].assignment, first(children).assignment)
    assert not torch.allclose(by_iteration[0].assignment, by_iteration[-1].assignment)  # it moved


def test_an_unset_em_variance_floor_is_the_layers_own():
    """model/routing=em leaves the floor unset: CapsNet's DigitCaps take 1e-4, near their votes' starting
    variances (under 0.01 they trained far behind every other routing); the matrix-capsule layers 0.01."""
    from capsexp.nn import EMRouting
    from capsexp.nn.functional._em_routing import variance_floor
    from capsexp.nn.routers import make_router

    assert EMRouting().sigma_eps is None
    assert make_router(EMRouting(), 32, 8, 10, 16).routing.sigma_eps == 1e-4
    assert make_router(EMRouting(sigma_eps=0.01), 32, 8, 10, 16).routing.sigma_eps == 0.01  # set: kept
    assert variance_floor(EMRouting()) == 0.01 and variance_floor(EMRouting(sigma_eps=1e-3)) == 1e-3
