"""A routing of CapsNet's kind in the matrix-capsule layers (WindowRouter): each ConvCaps window routed on its
own, the class capsules routed at once, against votes computed here from the layers' weights."""

import math

import pytest
import torch

from capsexp.config.routing_options import DynamicRouting, SelfRouting, SinkhornRouting
from capsexp.nn.matrix_capsules import ClassMatrixCapsules, ConvMatrixCapsules
from tests.helpers import TINY_RUN, run_cli_in_process, scalars

K, IN_TYPES, OUT_TYPES, P = 3, 2, 3, 4


def capsule_map(batch, types, height, width, seed=0):
    generator = torch.Generator().manual_seed(seed)
    poses = torch.randn(batch, types, P * P, height, width, generator=generator)
    activations = torch.rand(batch, types, height, width, generator=generator)
    return poses, activations


@pytest.mark.parametrize("routing", [DynamicRouting(), SinkhornRouting(), SelfRouting()], ids=type)
def test_each_conv_window_is_routed_on_its_own(routing):
    torch.manual_seed(0)
    layer = ConvMatrixCapsules(IN_TYPES, OUT_TYPES, K, stride=1, pose_size=P, routing=routing)
    poses, activations = capsule_map(2, IN_TYPES, 4, 5)
    out_poses, out_activations = layer(poses, activations)
    assert out_poses.shape == (2, OUT_TYPES, P * P, 2, 3)
    weight = layer.weight.detach().reshape(K * K * IN_TYPES, OUT_TYPES, P, P)  # slots (kernel row, col, type)
    for row, col in [(0, 0), (1, 2), (0, 1)]:
        window = poses[:, :, :, row : row + K, col : col + K]  # (N, T, 16, K, K)
        children = window.permute(0, 3, 4, 1, 2).reshape(2, K * K * IN_TYPES, P * P)
        child_activations = activations[:, :, row : row + K, col : col + K].permute(0, 2, 3, 1).reshape(2, -1)
        matrices = children.view(2, -1, P, P)
        votes = torch.einsum("nsab,sjbc->nsjac", matrices, weight).reshape(2, -1, OUT_TYPES, P * P)
        expected = layer.router.router(votes, children, child_activations)
        torch.testing.assert_close(out_poses[:, :, :, row, col], expected.poses.detach(), msg=f"window {row, col}")
        torch.testing.assert_close(out_activations[:, :, row, col], expected.activations.detach())


def test_gradient_reaches_weights_and_input_poses():
    layer = ConvMatrixCapsules(IN_TYPES, OUT_TYPES, K, stride=1, pose_size=P, routing=DynamicRouting())
    poses, activations = capsule_map(2, IN_TYPES, 4, 5)
    poses.requires_grad_(True)
    out_poses, out_activations = layer(poses, activations)
    (out_poses.square().sum() + out_activations.sum()).backward()
    for name, grad in [("weight", layer.weight.grad), ("poses", poses.grad)]:
        assert torch.isfinite(grad).all() and grad.abs().sum() > 0, name


def test_class_capsules_route_every_child_with_coordinate_addition():
    torch.manual_seed(0)
    height, width = 3, 2
    layer = ClassMatrixCapsules(IN_TYPES, 4, P, routing=DynamicRouting(), in_positions=height * width)
    poses, activations = capsule_map(2, IN_TYPES, height, width, seed=1)
    centres = torch.rand(height, width, 2, generator=torch.Generator().manual_seed(2))
    out_poses, out_activations = layer(poses, activations, centres)
    matrices = poses.permute(0, 3, 4, 1, 2).reshape(2, height * width, IN_TYPES, P, P)  # children (h, w, i)
    votes = torch.einsum("nsiab,ijbc->nsijac", matrices, layer.weight.detach())
    # Section 4: the scaled (row, column) of the child's centre added to the first two entries of the votes'
    # right-hand column.
    votes[..., 0, P - 1] += centres.reshape(-1, 1, 1, 2)[..., 0]
    votes[..., 1, P - 1] += centres.reshape(-1, 1, 1, 2)[..., 1]
    votes = votes.reshape(2, height * width * IN_TYPES, 4, P * P)
    children = matrices.reshape(2, -1, P * P)
    expected = layer.router.router(votes, children, activations.permute(0, 2, 3, 1).reshape(2, -1))
    torch.testing.assert_close(out_poses, expected.poses.detach())
    torch.testing.assert_close(out_activations, expected.activations.detach())


def test_a_map_other_than_in_positions_is_refused():
    layer = ClassMatrixCapsules(IN_TYPES, 4, P, routing=DynamicRouting(), in_positions=6)
    with pytest.raises(ValueError, match=r"in_positions=6.*2x2"):
        layer(*capsule_map(1, IN_TYPES, 2, 2))


def test_a_per_child_routing_without_in_positions_names_it():
    with pytest.raises(ValueError, match="in_positions"):
        ClassMatrixCapsules(IN_TYPES, 4, P, routing=SelfRouting())


@pytest.mark.parametrize("name", ["dynamic", pytest.param("self", marks=pytest.mark.slow)])  # self: per-child
def test_em_caps_small_trains_with_a_capsnet_routing_from_the_command_line(name, mnist_dir, tmp_path):
    result = run_cli_in_process(
        *TINY_RUN,
        f"paths.data_dir={mnist_dir}",
        "model=em_caps_small",
        f"model/routing={name}",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    losses = [e.value for key, events in scalars(tmp_path).items() if "loss" in key for e in events]
    assert losses and all(math.isfinite(value) for value in losses)
