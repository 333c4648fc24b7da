"""The Classifier LightningModule: it learns, logs what it promises, and restores its state."""

from __future__ import annotations

import functools
import itertools
import types

import lightning as L
import pytest
import torch

from capsexp.data import MNISTDataModule
from capsexp.errors import ConfigError
from capsexp.lit import Classifier, CrossEntropy
from capsexp.lit.margin import MarginSchedule
from capsexp.lit.schedulers import cosine_decay, exponential_decay
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
    with pytest.raises(ValueError) as error:
        make_module(lr_multipliers={"beta_a": 10.0, "alpha": 2.0, "bias": 3.0})
    assert str(error.value) == (
        "model.lr_multipliers names alpha, beta_a, which no parameter of LeNet5 is called; "
        "its parameters are called: bias, weight"
    )


@pytest.mark.parametrize("interval", ["step", "epoch"])
def test_cosine_decay_spans_the_run_the_trainer_will_do(interval):
    module = make_module(lr_scheduler={"scheduler": functools.partial(cosine_decay), "interval": interval})
    module.trainer = types.SimpleNamespace(estimated_stepping_batches=40, max_epochs=4)
    config = module.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    steps = 40 if interval == "step" else 4
    rates = []
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        rates.append(optimizer.param_groups[0]["lr"])
    assert rates[steps // 2 - 1] == pytest.approx(3e-3 / 2) and rates[-1] == pytest.approx(0, abs=1e-12)
    assert all(a > b for a, b in itertools.pairwise(rates))
    module.trainer = types.SimpleNamespace(estimated_stepping_batches=float("inf"), max_epochs=-1)
    with pytest.raises(ConfigError, match="a schedule over the run needs its length"):
        module.configure_optimizers()


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


# --- What the Classifier logs, and from what: a net whose prediction is fixed (class 0), so that every
# accuracy and loss mean has a value computable by hand from the labels.


class ConstantPrediction(torch.nn.Module):
    """Scores of a linear layer that start (and, at lr 0, stay) favouring class 0; records whether each
    call was in training mode and was given the targets."""

    def __init__(self, classes: int = 3):
        super().__init__()
        self.linear = torch.nn.Linear(2, classes)
        torch.nn.init.zeros_(self.linear.weight)
        with torch.no_grad():
            self.linear.bias.copy_(torch.arange(classes, 0, -1, dtype=torch.float))
        self.calls: list[tuple[bool, bool]] = []

    def forward(self, images, targets=None):
        self.calls.append((self.training, targets is not None))
        return self.linear(images.flatten(1)[:, :2])


class LossAndPixels:
    """Cross-entropy, and the batch's mean pixel: a term whose epoch mean over images is known."""

    terms = ("loss", "pixels")

    def __init__(self, extra_term: bool = False):
        self.extra_term = extra_term
        self.margins: list[float] = []

    def __call__(self, scores, images, targets):
        terms = {"loss": torch.nn.functional.cross_entropy(scores, targets), "pixels": images.mean()}
        if self.extra_term:
            terms["surprise"] = images.sum()
        return terms


class WithMargin(LossAndPixels):
    margin = 0.0

    def __call__(self, scores, images, targets):
        self.margins.append(self.margin)
        return super().__call__(scores, images, targets)


class RecordingSchedule(MarginSchedule):
    def __init__(self):
        self.seen: list[tuple[int, float, float]] = []

    def margin(self, step, epoch, total_steps):
        self.seen.append((step, epoch, total_steps))
        return 0.5 * step + 0.25 * epoch


def labelled_set(labels: list[int], seed: int) -> torch.utils.data.TensorDataset:
    images = torch.rand(len(labels), 1, 2, 2, generator=torch.Generator().manual_seed(seed))
    return torch.utils.data.TensorDataset(images, torch.tensor(labels))


TRAIN_LABELS = [0, 1, 2, 0, 1, 1, 2, 2]  # 2 of 8 are class 0
VAL_LABELS = [0, 0, 0, 1, 2]  # micro accuracy 3/5, macro 1/3
TEST_LABELS = ([0, 1, 1, 2, 1], [0, 0, 2, 0])


class TensorData(L.LightningDataModule):
    """Fixed tensors; with ``test_set_names``, one test set per name (like rotated MNIST's)."""

    def __init__(self, test_set_names: list[str] | None = None, batch_size: int = 2, iterable: bool = False):
        super().__init__()
        if test_set_names is not None:
            self.test_set_names = test_set_names
        self.batch_size, self.iterable = batch_size, iterable

    def loader(self, dataset):
        return torch.utils.data.DataLoader(dataset, batch_size=self.batch_size)

    def train_dataloader(self):
        dataset = labelled_set(TRAIN_LABELS, 0)
        if self.iterable:  # no length: Lightning cannot know the number of batches in an epoch
            dataset = IterableTensors(dataset)
        return self.loader(dataset)

    def val_dataloader(self):
        return self.loader(labelled_set(VAL_LABELS, 1))

    def test_dataloader(self):
        names = getattr(self, "test_set_names", [""])
        return [self.loader(labelled_set(TEST_LABELS[i], 2 + i)) for i in range(len(names))]


class IterableTensors(torch.utils.data.IterableDataset):
    def __init__(self, dataset: torch.utils.data.TensorDataset):
        self.tensors = dataset.tensors

    def __iter__(self):
        return iter(zip(*self.tensors, strict=True))


def fixed_module(objective=None, margin=None, **kwargs) -> Classifier:
    return Classifier(
        ConstantPrediction(),
        objective or LossAndPixels(),
        functools.partial(torch.optim.SGD, lr=0.0),
        margin=margin,
        num_classes=3,
        **kwargs,
    )


def image_mean(dataset) -> float:
    return dataset.tensors[0].flatten(1).mean(1).mean().item()


def test_logged_names_values_and_progress_bar_of_a_run(tmp_path):
    """Every logged name, its value (accuracies are micro: the fraction of images right; loss terms are
    means over images, also over an uneven last batch) and what the progress bar shows."""
    module = fixed_module(objective=WithMargin(), margin=RecordingSchedule())
    logger = L.pytorch.loggers.CSVLogger(tmp_path)
    trainer = make_trainer(tmp_path, max_epochs=1, logger=logger, num_sanity_val_steps=0)
    trainer.fit(module, datamodule=TensorData(batch_size=3))  # batches of 3, 3, 2 (val: 3, 2)
    metrics = trainer.callback_metrics
    assert set(metrics) == {
        "train/loss_step", "train/pixels_step", "train/loss_epoch", "train/pixels_epoch", "train/acc",
        "train/margin", "val/loss", "val/pixels", "val/acc", "val/acc_best",
    }  # fmt: skip
    assert set(trainer.progress_bar_metrics) == {"train/loss_step", "train/acc", "val/loss", "val/acc", "val/acc_best"}
    assert metrics["train/acc"].item() == pytest.approx(2 / 8)
    assert metrics["val/acc"].item() == pytest.approx(3 / 5)
    assert metrics["val/acc_best"].item() == pytest.approx(3 / 5)
    assert metrics["train/pixels_epoch"].item() == pytest.approx(image_mean(labelled_set(TRAIN_LABELS, 0)))
    assert metrics["val/pixels"].item() == pytest.approx(image_mean(labelled_set(VAL_LABELS, 1)))
    # Only training shows the net the labels; the objective is given the images.
    net = module.net
    assert set(net.calls) == {(True, True), (False, False)}
    assert net.calls.count((True, True)) == 3
    # The margin schedule sees the global step, the fractional epoch and the run's length in steps
    # before each training step.
    assert module.margin_schedule.seen == [(0, 0.0, 3), (1, pytest.approx(1 / 3), 3), (2, pytest.approx(2 / 3), 3)]
    last = 1.0 + 0.25 * 2 / 3
    assert module.objective.margins == pytest.approx([0.0, 0.5 + 0.25 / 3, last, last, last])  # then 2 val batches
    assert metrics["train/margin"].item() == pytest.approx(last)
    # The module's hyperparameters hold plain values only, and go to no logger (capsexp.run.stages logs the config).
    assert dict(module.hparams) == {"num_classes": 3, "compile": False}
    assert logger.experiment.hparams == {}


def test_a_margin_schedule_over_an_epoch_of_unknown_length_sees_whole_epochs(tmp_path):
    schedule = RecordingSchedule()
    module = fixed_module(objective=WithMargin(), margin=schedule)
    trainer = make_trainer(tmp_path, max_steps=3, limit_val_batches=0)
    trainer.fit(module, datamodule=TensorData(iterable=True))
    assert schedule.seen == [(0, 0.0, 3), (1, 0.0, 3), (2, 0.0, 3)]  # the run's length: max_steps


def test_each_test_set_has_its_accuracy_and_loss_means_also_after_fitting_on_other_data(tmp_path):
    """Fit on data with one test set, then test on data with two (one name with a dot, which no module
    name may hold): each set's micro accuracy under its own name, the first also as test/acc."""
    module = fixed_module()
    trainer = make_trainer(tmp_path, max_epochs=1, num_sanity_val_steps=0)
    trainer.fit(module, datamodule=TensorData())
    assert len(module.test_accuracy["per_set"]) == 1
    results = trainer.test(module, datamodule=TensorData(test_set_names=["", "rot22.5"]), verbose=False)
    merged = {name: value for result in results for name, value in result.items()}
    assert set(merged) == {"test/acc", "test/loss", "test/pixels", "test/acc_rot22.5", "test/loss_rot22.5",
                           "test/pixels_rot22.5"}  # fmt: skip
    assert merged["test/acc"] == pytest.approx(1 / 5)
    assert merged["test/acc_rot22.5"] == pytest.approx(3 / 4)
    assert merged["test/pixels_rot22.5"] == pytest.approx(image_mean(labelled_set(TEST_LABELS[1], 3)))
    with pytest.raises(ValueError) as error:
        module.test_step(next(iter(TensorData().val_dataloader())), 0, dataloader_idx=2)
    assert str(error.value) == "test DataLoader 2 has no name: the DataModule declares 2 test sets in test_set_names"


def test_without_a_trainer_setup_prepares_the_one_plain_test_set():
    module = fixed_module()
    module.setup("test")
    assert module.test_set_names == [""]
    assert len(module.test_accuracy["per_set"]) == 1


def test_a_term_the_objective_did_not_declare_is_refused_by_name(tmp_path):
    module = fixed_module(objective=LossAndPixels(extra_term=True))
    trainer = make_trainer(tmp_path, max_steps=1, limit_val_batches=0)
    with pytest.raises(KeyError) as error:
        trainer.fit(module, datamodule=TensorData())
    assert error.value.args == (
        "train/surprise_epoch: the objective LossAndPixels returned a term that is not in its terms ('loss', 'pixels')",
    )


def test_objectives_without_presence_scores_gather_none():
    assert fixed_module().val_presence is None


def test_a_margin_without_a_spread_loss_is_refused():
    with pytest.raises(ValueError) as error:
        fixed_module(margin=RecordingSchedule())
    assert str(error.value) == (
        "model.margin is set, but the objective LossAndPixels has no margin to schedule "
        "(only the spread loss has one): remove model/margin"
    )


def test_the_net_is_compiled_once_and_only_when_asked(monkeypatch):
    for compile, expected in [(True, 1), (False, 0)]:
        module = fixed_module(compile=compile)
        calls: list[int] = []
        monkeypatch.setattr(module.net, "compile", functools.partial(calls.append, 1))
        module.configure_model()
        module.configure_model()
        assert len(calls) == expected
    assert fixed_module().compile_net is False


def test_one_parameter_group_has_no_name():
    (group,) = make_module().parameter_groups()
    assert "name" not in group and group["lr_multiplier"] == 1.0
