"""The Classifier LightningModule: it learns, logs what it promises, and restores its state."""

from __future__ import annotations

import functools

import lightning as L
import pytest
import torch

from capsexp.data import MNISTDataModule
from capsexp.lit import Classifier, CrossEntropy
from capsexp.lit.schedulers import exponential_decay
from capsexp.models import LeNet5


def make_trainer(tmp_path, **kwargs) -> L.Trainer:
    options = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        enable_checkpointing=False,
    )
    return L.Trainer(**{**options, **kwargs})


def make_module(**kwargs) -> Classifier:
    return Classifier(LeNet5(), CrossEntropy(), functools.partial(torch.optim.Adam, lr=3e-3), **kwargs)


def test_a_tiny_run_learns_and_logs_its_metrics(mnist_dir, tmp_path):
    torch.manual_seed(0)
    datamodule = MNISTDataModule(mnist_dir, batch_size=25, val_size=50, verify_checksums=False, download=False)
    module = make_module()
    trainer = make_trainer(tmp_path, max_epochs=6)
    trainer.fit(module, datamodule=datamodule)
    metrics = trainer.callback_metrics
    for name in ["train/loss_step", "train/loss_epoch", "train/acc", "val/loss", "val/acc", "val/acc_best"]:
        assert name in metrics, name
    assert metrics["val/acc"] >= 0.9, "LeNet5 must learn the synthetic digits"
    assert metrics["val/acc_best"] >= metrics["val/acc"]
    (result,) = trainer.test(module, datamodule=datamodule, verbose=False)
    assert result["test/acc"] >= 0.9


def test_forward_passes_targets_only_to_nets_that_take_them():
    class NeedsTargets(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 3)
            self.seen = "unset"

        def forward(self, images, targets=None):
            self.seen = targets
            return self.linear(images)

    net = NeedsTargets()
    module = Classifier(net, CrossEntropy(), functools.partial(torch.optim.SGD, lr=0.1), num_classes=3)
    targets = torch.tensor([0, 2])
    module(torch.rand(2, 4), targets)
    assert net.seen is targets
    assert not make_module().net_takes_targets


def test_best_validation_accuracy_is_saved_in_the_checkpoint():
    module = make_module()
    module.val_acc_best(torch.tensor(0.75))
    restored = make_module()
    restored.load_state_dict(module.state_dict())
    assert restored.val_acc_best.compute() == pytest.approx(0.75)


def test_scheduler_config_is_passed_to_lightning():
    module = make_module(
        lr_scheduler={
            "scheduler": functools.partial(exponential_decay, decay_steps=10),
            "interval": "step",
            "frequency": 1,
        }
    )
    config = module.configure_optimizers()
    assert config["lr_scheduler"]["interval"] == "step"
    assert isinstance(config["lr_scheduler"]["scheduler"], torch.optim.lr_scheduler.ExponentialLR)


def test_lr_multipliers_give_named_parameters_their_own_learning_rate_under_the_scheduler():
    module = make_module(
        lr_multipliers={"bias": 10.0},
        lr_scheduler={"scheduler": functools.partial(exponential_decay, decay_steps=1, decay_rate=0.5)},
    )
    config = module.configure_optimizers()
    optimizer = config["optimizer"]
    biases = {id(p) for name, p in module.named_parameters() if name.endswith(".bias")}
    rates = {}
    for group in optimizer.param_groups:
        kinds = {id(p) in biases for p in group["params"]}
        assert len(kinds) == 1  # a group holds biases only or weights only
        rates[kinds.pop()] = group["lr"]
        assert group["name"] == f"x{group['lr_multiplier']:g}"  # the rate's name in TensorBoard
    assert rates == {True: pytest.approx(3e-2), False: pytest.approx(3e-3)}
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(module.parameters()))
    optimizer.step()
    config["lr_scheduler"]["scheduler"].step()  # the decay scales both groups from their own rate
    assert sorted(g["lr"] for g in optimizer.param_groups) == pytest.approx([1.5e-3, 1.5e-2])


def test_lr_multipliers_naming_no_parameter_are_refused():
    with pytest.raises(ValueError, match=r"model\.lr_multipliers names beta_a.*parameters are called: bias, weight"):
        make_module(lr_multipliers={"beta_a": 10.0})


@pytest.mark.parametrize("staircase", [False, True])
def test_exponential_decay_matches_the_tensorflow_formula(staircase):
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=1.0)
    scheduler = exponential_decay(optimizer, decay_rate=0.96, decay_steps=20, staircase=staircase)
    for step in range(1, 51):
        optimizer.step()
        scheduler.step()
        exponent = step // 20 if staircase else step / 20
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.96**exponent, rel=1e-6)


def test_exponential_decay_rejects_nonsense():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match="decay_steps"):
        exponential_decay(optimizer, decay_steps=0)


class FixedScores(torch.nn.Module):
    """Scores that do not depend on the image: class k scores SCORES[k]."""

    SCORES = torch.tensor([0.9, 0.6, 0.3, 0.2, 0.1, 0.05, 0.0, 0.0, 0.7, 0.4])

    def __init__(self):
        super().__init__()
        self.unused = torch.nn.Parameter(torch.zeros(1))

    def forward(self, images):
        return self.SCORES.expand(len(images), -1).clone()


def test_presence_medians_over_the_validation_set_for_capsule_objectives_only(mnist_dir, tmp_path):
    """val/presence_gap: median over validation images of (target score - largest other score)."""
    from capsexp.lit import SpreadLoss

    datamodule = MNISTDataModule(mnist_dir, batch_size=16, val_size=50, verify_checksums=False, download=False)
    module = Classifier(FixedScores(), SpreadLoss(), functools.partial(torch.optim.SGD, lr=0.1))
    trainer = make_trainer(tmp_path, num_sanity_val_steps=2)
    trainer.validate(module, datamodule=datamodule, verbose=False)
    labels = torch.cat([targets for _, targets in datamodule.val_dataloader()])
    scores = FixedScores.SCORES
    target = scores[labels]
    largest_other = torch.stack([torch.cat([scores[:k], scores[k + 1 :]]).max() for k in labels.tolist()])
    metrics = trainer.callback_metrics
    assert metrics["val/presence_gap"].item() == pytest.approx((target - largest_other).median().item())
    assert metrics["val/presence_target"].item() == pytest.approx(target.median().item())
    assert metrics["val/presence_largest_other"].item() == pytest.approx(largest_other.median().item())
    # The next epoch starts afresh: a second validation gives the same medians, not those of twice the data.
    trainer.validate(module, datamodule=datamodule, verbose=False)
    assert module.val_presence.update_count == 0
    assert trainer.callback_metrics["val/presence_gap"].item() == pytest.approx(
        (target - largest_other).median().item()
    )
    # Logits (cross-entropy) are not presence scores: nothing logged.
    lenet = make_module()
    trainer = make_trainer(tmp_path)
    trainer.validate(lenet, datamodule=datamodule, verbose=False)
    assert not any(name.startswith("val/presence") for name in trainer.callback_metrics)
