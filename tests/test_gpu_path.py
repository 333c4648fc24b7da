"""The GPU path, checked as far as the CPU allows: data drawn on the device, compiled nets, bf16."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DistributedSampler

from capsexp.data import MNISTDataModule
from capsexp.data.device_loader import DeviceBatchLoader
from capsexp.models import CapsNet, LeNet5, MatrixCapsNet
from capsexp.nn import EM_PAPER, EMRouting
from tests.helpers import TINY_RUN, FakeTrainer, run_cli_in_process, scalars


def test_device_loader_yields_the_samplers_order_in_batches():
    images = torch.arange(10).view(10, 1, 1, 1).expand(10, 1, 2, 2).contiguous()
    targets = torch.arange(10)
    sampler = [3, 1, 4, 0, 9, 2, 6]
    loader = DeviceBatchLoader(images, targets, batch_size=3, sampler=sampler)
    batches = list(loader)
    assert len(loader) == len(batches) == 3
    assert [b[1].tolist() for b in batches] == [[3, 1, 4], [0, 9, 2], [6]]
    assert all(torch.equal(b[0][:, 0, 0, 0], b[1]) for b in batches)  # images travel with their targets
    stored = DeviceBatchLoader(images, targets, 4)  # no sampler: the stored order, 4 + 4 + 2
    ordered = torch.cat([t for _, t in stored])
    assert ordered.tolist() == list(range(10)) and len(stored) == 3
    with pytest.raises(ValueError, match=r"^10 images but 9 targets$"):
        DeviceBatchLoader(images, targets[:9], 4)


def _fake_trainer(world_size: int, rank: int) -> FakeTrainer:
    return FakeTrainer(world_size=world_size, global_rank=rank)


@pytest.mark.parametrize(
    "on_device,expected",
    [(True, DeviceBatchLoader), ("auto", torch.utils.data.DataLoader), (False, torch.utils.data.DataLoader)],
)
def test_on_device_picks_the_loader(mnist_dir, on_device, expected):
    datamodule = MNISTDataModule(mnist_dir, batch_size=20, val_size=60, verify_checksums=False, on_device=on_device)
    datamodule.trainer = _fake_trainer(1, 0)
    datamodule.prepare_data()
    datamodule.setup("fit")
    assert isinstance(datamodule.train_dataloader(), expected)  # auto: the CPU keeps the DataLoader


def test_device_batches_are_sharded_like_the_dataloader_path(mnist_dir):
    """Two processes: training shards from DistributedSampler, evaluation shards without repeats,
    and together each evaluation shard pair covers the set exactly once."""
    shards = []
    for rank in (0, 1):
        datamodule = MNISTDataModule(mnist_dir, batch_size=20, val_size=61, verify_checksums=False, on_device=True)
        datamodule.trainer = _fake_trainer(2, rank)
        datamodule.prepare_data()
        datamodule.setup("fit")
        train, val = datamodule.train_dataloader(), datamodule.val_dataloader()
        assert isinstance(train.sampler, DistributedSampler) and train.batch_size == 10
        assert sum(len(targets) for _, targets in train) == len(train.sampler)  # the training shard, once
        assert isinstance(val.sampler, UnrepeatedDistributedSampler)
        shards.append(list(val.sampler))
        assert sum(len(targets) for _, targets in val) == len(shards[-1])
    assert not set(shards[0]) & set(shards[1])  # disjoint
    assert sorted(shards[0] + shards[1]) == list(range(61))  # every image once


def test_a_run_with_data_on_the_device_learns(mnist_dir, tmp_path):
    result = run_cli_in_process(
        *TINY_RUN,
        f"paths.data_dir={mnist_dir}",
        "data.on_device=true",
        "trainer.max_epochs=3",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    logged = scalars(tmp_path)
    assert logged["val/acc"][-1].value >= 0.75  # chance: 0.1; the DataLoader path reaches 0.85 here too
    assert {"perf/train_epoch_s", "perf/train_images_per_s"} <= set(logged)


@pytest.mark.gpu
def test_a_gpu_run_with_its_defaults_learns_in_bf16(mnist_dir, tmp_path):
    """On a GPU, data.on_device=auto holds the data there; bf16-mixed; peak GPU memory is logged."""
    result = run_cli_in_process(
        *[o for o in TINY_RUN if not o.startswith("trainer.accelerator=")],
        f"paths.data_dir={mnist_dir}",
        "trainer.accelerator=gpu",
        "trainer.precision=bf16-mixed",
        "trainer.max_epochs=3",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    logged = scalars(tmp_path)
    assert logged["val/acc"][-1].value >= 0.75
    assert logged["perf/peak_memory_gib"][-1].value > 0


@pytest.mark.parametrize(
    "model,extra",
    [
        ("lenet5", []),
        ("capsnet", ["model.net.conv_channels=16", "model.net.primary_types=4"]),
        (
            "em_caps_small",
            [
                "model.net.conv_channels=16",
                "model.net.primary_types=4",
                "model.net.conv_caps1_types=4",
                "model.net.conv_caps2_types=4",
                "model/margin=linear_steps",  # a margin near 0.2 over the 24 steps: the loss can only fall
            ],
        ),
    ],
)
@pytest.mark.slow
def test_every_model_trains_under_bf16_mixed_without_nan(mnist_dir, tmp_path, model, extra):
    result = run_cli_in_process(
        *TINY_RUN,
        f"paths.data_dir={mnist_dir}",
        f"model={model}",
        *extra,
        "trainer.precision=bf16-mixed",
        "trainer.max_epochs=2",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    losses = [event.value for event in scalars(tmp_path)["train/loss_step"]]
    assert len(losses) == 24 and all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]


# Under bf16 autocast against float32, on the same weights and batch: the largest score difference
# over the largest score, and the difference of all gradients together over their norm. Measured here
# on these nets: LeNet5 0.005 and 0.017, BaselineCNN 0.006 and 0.011, CapsNet 0.006 and 0.014 (each
# conv and linear layer rounds its inputs to 8 bits); MatrixCapsNet computes in float32 under autocast
# (its paper recipe's gradients moved by a third in bf16), so it gives float32's results exactly.
BF16_TOLERANCE = {"LeNet5": (0.02, 0.05), "BaselineCNN": (0.02, 0.05), "CapsNet": (0.02, 0.05), "MatrixCapsNet": (0, 0)}


@pytest.mark.parametrize("name", list(BF16_TOLERANCE))
def test_bf16_autocast_keeps_every_nets_scores_and_gradients_near_float32(name):
    from capsexp.lit import class_scores
    from capsexp.models import BaselineCNN
    from capsexp.nn.functional import spread_loss

    nets = {**_nets(), "BaselineCNN": lambda: BaselineCNN(conv_layers=(32, 32, 16), hidden_sizes=(64, 32))}
    if name == "MatrixCapsNet":  # the paper's recipe, whose gradients bf16 moved most
        nets[name] = lambda: MatrixCapsNet(
            conv_channels=8, primary_types=4, conv_caps1_types=4, conv_caps2_types=4, routing=EM_PAPER, conv1_norm=False
        )
    torch.manual_seed(0)
    net = nets[name]()
    images, targets = torch.rand(8, 1, 28, 28), torch.randint(0, 10, (8,))
    results = []
    for bf16 in (False, True):
        net.zero_grad()
        torch.manual_seed(1)  # the same dropout masks
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            scores = class_scores(net(images))
        spread_loss(scores.float(), targets, 0.2).backward()
        gradient = torch.cat([p.grad.flatten() for p in net.parameters() if p.grad is not None])
        results.append((scores.detach().float(), gradient))
    (scores, gradient), (bf16_scores, bf16_gradient) = results
    score_tolerance, gradient_tolerance = BF16_TOLERANCE[name]
    assert (bf16_scores - scores).abs().max() <= score_tolerance * scores.abs().max()
    assert (bf16_gradient - gradient).norm() <= gradient_tolerance * gradient.norm()


def _nets() -> dict:
    return {
        "LeNet5": lambda: LeNet5(),
        "CapsNet": lambda: CapsNet(conv_channels=16, primary_types=4),
        "MatrixCapsNet": lambda: MatrixCapsNet(
            conv_channels=8,
            primary_types=4,
            conv_caps1_types=4,
            conv_caps2_types=4,
            # Two iterations trace the first and the later ones (each iteration is traced anew).
            routing=EMRouting(final_lambda=3.0, iterations=2),
        ),
    }


# aot_eager traces each net (custom autograd functions included) through dynamo and AOTAutograd in
# seconds; inductor also generates and compiles C++ kernels (a minute per net here): make test-all. So does
# MatrixCapsNet's aot_eager trace (10 s here: its EM routing unrolled), LeNet5's and CapsNet's staying.
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=[pytest.mark.slow] * (name == "MatrixCapsNet")) for name in _nets()]
)
def test_compiled_nets_give_the_eager_results(name, backend):
    torch.manual_seed(0)
    net = _nets()[name]()
    images = torch.rand(4, 1, 28, 28)

    def outputs_and_gradients(module):
        module.zero_grad()
        output = module(images)
        scores = output if isinstance(output, torch.Tensor) else output.scores
        scores.sum().backward()
        # A compiled graph may give a parameter the scores do not depend on a zero gradient, not None.
        return scores.detach().clone(), {
            n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in module.named_parameters()
        }

    eager_scores, eager_grads = outputs_and_gradients(net)
    net.compile(backend=backend)
    compiled_scores, compiled_grads = outputs_and_gradients(net)
    torch.testing.assert_close(compiled_scores, eager_scores, rtol=1e-4, atol=1e-5)
    for parameter, eager in eager_grads.items():
        torch.testing.assert_close(compiled_grads[parameter], eager, rtol=1e-3, atol=1e-5, msg=parameter)
