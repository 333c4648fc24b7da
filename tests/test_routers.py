"""Routing as a swappable part: every algorithm in CapsNet's place (``model=capsnet model/routing=<name>``)
trains from the command line, and each router returns what the class scores and diagnostics read; what
a model costs, as a run reports it."""

from __future__ import annotations

import pytest
import torch

from capsexp.config.hydra_setup import ROUTINGS
from capsexp.nn import DynamicRouting, RoutingCapsules
from capsexp.run.model_cost import forward_flops_per_image
from tests.helpers import TINY_RUN, load_events, run_cli_in_process, scalars


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


@pytest.mark.parametrize("name", list(ROUTINGS))
def test_capsnet_trains_with_every_routing_from_the_command_line(name, mnist_dir, tmp_path):
    result = run_cli_in_process(
        *TINY_RUN,
        f"paths.data_dir={mnist_dir}",
        "model=capsnet",
        f"model/routing={name}",
        "model.net.conv_channels=8",
        "model.net.primary_types=2",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1",
        "callbacks.routing_diagnostics.every_n_steps=1",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    logged = scalars(tmp_path)
    assert "test/acc" in logged and "train/margin_loss_step" in logged
    # The routing diagnostics, whatever the algorithm: how decided the assignment, how input-dependent the activations.
    assert [e.step for e in logged["routing/digits/entropy"]] == [0, 1]
    assert all(0 <= e.value <= 1 + 1e-6 for e in logged["routing/digits/entropy"])
    assert logged["routing/digits/activation_std_across_inputs"][0].value >= 0
    # What routing did, whatever the algorithm: the weight of each primary capsule's vote per class.
    assert "routing/digits/couplings" in load_events(tmp_path, images=0).Tags()["images"]


def test_a_models_forward_flops_are_its_matrix_products_per_image_and_its_mode_is_kept():
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(2 * 5 * 5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    net.train()
    assert forward_flops_per_image(net, channels=2, image_size=5) == 2 * (50 * 7 + 7 * 3)  # 2 per multiply-add
    assert net.training
