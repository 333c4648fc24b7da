"""Where the code picks one of two things, a fixture in which the two differ, so that taking the other
side fails: the best checkpoint and the last, training and evaluation batches, seed 0 and no seed,
global rank zero and the other ranks. (Attack source and target, validation and test sets, the first
and the last logged value: tests/test_attacks.py, tests/test_mnist_data.py, tests/test_compare.py.)"""

from __future__ import annotations

import re
from types import SimpleNamespace

import torch
from lightning.pytorch.loggers import TensorBoardLogger

from capsexp.callbacks.image_logging import tensorboard_writer
from capsexp.data import MNISTDataModule, SmallNORBDataModule
from tests.helpers import TINY_RUN, FakeTrainer, run_cli_in_process, scalars


def test_a_run_tests_its_best_checkpoint_not_its_last(mnist_dir, tmp_path):
    """A learning rate at which validation accuracy rises, then falls: the best checkpoint is not the
    last state, and the test is of the best."""
    result = run_cli_in_process(
        *TINY_RUN,
        f"paths.data_dir={mnist_dir}",
        "trainer.max_epochs=4",
        "model.optimizer.lr=0.03",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    accuracies = [event.value for event in scalars(tmp_path)["val/acc"]]
    assert max(accuracies) > accuracies[-1], accuracies  # the fixture: best and last differ
    (best,) = [p for p in (tmp_path / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt"]
    steps = [event.step for event in scalars(tmp_path)["val/acc"]]
    best_step = steps[accuracies.index(max(accuracies))]
    assert int(re.search(r"step_(\d+)", best.name).group(1)) == best_step + 1  # Lightning counts from 0
    assert f"Testing {best}" in result.stdout + result.stderr


def _pixels(datamodule, batch, training: bool) -> torch.Tensor:
    datamodule.trainer = FakeTrainer(training=training)
    return datamodule.pixel_batch(batch, 0)[0]


def test_training_batches_are_augmented_and_evaluation_batches_are_not(mnist_dir, norb_dir):
    """MNIST shifted by up to 2 pixels in training, the stored digit otherwise; smallNORB cropped at random
    and jittered in training, centre-cropped otherwise."""
    mnist = MNISTDataModule(mnist_dir, val_size=60, verify_checksums=False, download=False, train_shift=2)
    mnist.prepare_data()
    mnist.setup("fit")
    batch = next(iter(mnist.val_dataloader()))
    stored = batch[0].float() / 255
    assert torch.equal(_pixels(mnist, batch, training=False), stored)
    assert not torch.equal(_pixels(mnist, batch, training=True), stored)

    norb = SmallNORBDataModule(norb_dir, val_size=12, verify_checksums=False, download=False)
    norb.prepare_data()
    norb.setup("fit")
    batch = next(iter(norb.val_dataloader()))
    side, crop = batch[0].shape[-1], norb.hparams.crop_size
    margin = (side - crop) // 2
    centre = batch[0].float()[..., margin : margin + crop, margin : margin + crop] / 255
    assert torch.equal(_pixels(norb, batch, training=False), centre)
    assert not torch.equal(_pixels(norb, batch, training=True), centre)


def _first_losses(mnist_dir, folder, seed: str) -> list[float]:
    result = run_cli_in_process(
        *TINY_RUN,
        f"paths.data_dir={mnist_dir}",
        f"seed={seed}",
        "trainer.max_steps=2",
        "trainer.limit_val_batches=0",
        "test=false",
        f"hydra.run.dir={folder}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return [event.value for event in scalars(folder)["train/loss_step"]]


def test_seed_zero_is_a_seed_and_null_is_none(mnist_dir, tmp_path):
    """seed=0 seeds (two runs alike, unlike seed=1's); seed=null does not (two runs differ)."""
    zero = _first_losses(mnist_dir, tmp_path / "a", "0")
    assert _first_losses(mnist_dir, tmp_path / "b", "0") == zero
    assert _first_losses(mnist_dir, tmp_path / "c", "1") != zero
    assert _first_losses(mnist_dir, tmp_path / "d", "null") != _first_losses(mnist_dir, tmp_path / "e", "null")


def test_only_global_rank_zero_gets_the_tensorboard_writer(tmp_path):
    """The figures are drawn and written by one process: the others get no writer (Lightning would hand
    them a writer that discards, after the figure was drawn)."""
    logger = TensorBoardLogger(tmp_path)
    zero = SimpleNamespace(is_global_zero=True, loggers=[logger])
    assert tensorboard_writer(zero) is logger.experiment
    assert tensorboard_writer(SimpleNamespace(is_global_zero=False, loggers=[logger])) is None
