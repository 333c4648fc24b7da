"""One LightningModule for every classifier: LeNet5, CapsNet, matrix capsules.

The wrapped ``net`` is a pure ``torch.nn.Module``. Its forward takes images, plus the targets when
its signature names a ``targets`` argument (capsule decoders are fed the true class in training), and
returns either class scores or an object with a ``scores`` field and extras (reconstructions, ...).
The ``objective`` turns that output into named loss terms (see :mod:`capsexp.lit.objectives`).

A batch is ``(images, targets)`` with (N,) class indices, or, for T objects per image (MultiMNIST),
``(images, targets (N, T), objects (N, T, C, H, W))``: the prediction is then the T highest class
scores, right only when it names every object, and reconstructions are compared with each object alone.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import lightning as L
import torch
from pydantic import PositiveFloat, PositiveInt
from torchmetrics import CatMetric, MaxMetric, MeanMetric, Metric
from torchmetrics.classification import MulticlassAccuracy, MultilabelExactMatch

from capsexp.errors import ConfigError
from capsexp.lit.margin import MarginSchedule
from capsexp.lit.objectives import class_scores, multi_hot
from capsexp.records.metric_names import PLAIN, TEST_ACC, VAL_ACC, VAL_ACC_BEST, metric_suffix, presence_metric
from capsexp.records.run_record import RunRecord

Batch = tuple[torch.Tensor, ...]  # (images, targets) or (images, targets, objects)


class Classifier(L.LightningModule):
    """Train, validate and test a classifier; log losses, accuracy and the best validation accuracy.

    Args:
        net: the network.
        objective: ``objective(output, images, targets) -> {"loss": ..., other terms}``, naming every
            term it may return in ``objective.terms``.
        optimizer: partial optimizer, called with the parameters (Hydra ``_partial_: true``).
        lr_scheduler: ``None``, or Lightning's scheduler config dict whose ``scheduler`` entry is a
            partial called with the optimizer (``interval``, ``frequency``, ... pass through).
        margin: a :class:`~capsexp.lit.margin.MarginSchedule` that sets ``objective.margin`` before
            every training step (the spread loss of EM capsules), or ``None``.
        num_classes: number of classes, for the accuracy metrics.
        compile: compile the net with ``torch.compile`` (``nn.Module.compile``: in place, so the
            checkpoint's parameter names stay those of the eager net), once, before training or testing.
        lr_multipliers: ``{parameter name: factor}``: parameters whose name ends in ``.<name>`` (e.g.
            ``beta_a``) learn at the optimizer's learning rate times the factor, in their own
            parameter group; every name must match a parameter of the net.
    """

    def __init__(
        self,
        net: torch.nn.Module,
        objective: Callable[..., dict[str, torch.Tensor]],
        optimizer: Callable[..., torch.optim.Optimizer],
        lr_scheduler: dict[str, Any] | None = None,
        margin: MarginSchedule | None = None,
        num_classes: PositiveInt = 10,
        compile: bool = False,
        lr_multipliers: Mapping[str, PositiveFloat] | None = None,
    ) -> None:
        super().__init__()
        if margin is not None and not hasattr(objective, "margin"):
            raise ValueError(
                f"model.margin is set, but the objective {type(objective).__name__} has no margin to schedule "
                "(only the spread loss has one): remove model/margin"
            )
        # Only plain values go into the checkpoint's hyperparameters: checkpoints load with
        # torch.load(weights_only=True), which refuses pickled callables. The run's whole config
        # is logged by capsexp.run.train, and the net's weights are in the state dict.
        self.save_hyperparameters({"num_classes": num_classes, "compile": compile}, logger=False)
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.margin_schedule = margin
        self.net = net
        self.objective = objective
        self.net_takes_targets = "targets" in inspect.signature(net.forward).parameters
        self.lr_multipliers = {str(name): float(factor) for name, factor in (lr_multipliers or {}).items()}
        parameter_names = {name.rsplit(".", 1)[-1] for name, _ in net.named_parameters()}
        unknown = sorted(set(self.lr_multipliers) - parameter_names)
        if unknown:
            raise ValueError(
                f"model.lr_multipliers names {', '.join(unknown)}, which no parameter of "
                f"{type(net).__name__} is called; its parameters are called: {', '.join(sorted(parameter_names))}"
            )
        self.compile_net = compile
        self._compiled = False
        # What every checkpoint records of its run (capsexp.records.run_record), set by the run.
        self.run_record: RunRecord | None = None

        self.num_classes = num_classes
        # Accuracy as the fraction of images whose predicted classes are exactly the present ones: for
        # one object per image the usual accuracy; for several, the MultiMNIST paper's (both digits
        # right). One object until setup reads the DataModule's objects_per_image.
        self.objects_per_image = 1
        self.train_acc = accuracy_metric(num_classes, 1)
        self.val_acc = accuracy_metric(num_classes, 1)
        # Persistent, so that a resumed run keeps the best accuracy seen before it stopped.
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)
        # Epoch means of the loss terms (the objective's ``terms``): per stage, one MeanMetric per
        # logged name. Its sum and weight are reduced over processes exactly; Lightning's own mean
        # divides an integer image count by the number of processes, which truncates for uneven shards.
        self.loss_means = torch.nn.ModuleDict(
            {
                f"{stage}_terms": torch.nn.ModuleDict({_key(term): MeanMetric() for term in objective.terms})
                for stage in ("train", "val", "test")  # not "train" alone: nn.Module.train is a method
            }
        )
        # Presence scores (capsule lengths or activations, see objectives): each validation image's
        # target score and largest other score, gathered over processes for the epoch's medians.
        self.val_presence = CatMetric() if getattr(objective, "presence_scores", False) else None
        # Per test set (the DataModule's test_set_names): an accuracy, and the loss means; made in setup.
        self.test_set_names: list[str] = [PLAIN]
        # (nested one level, so that the model summary shows one line for them, not one per set)
        self.test_accuracy = torch.nn.ModuleDict({"per_set": torch.nn.ModuleList()})
        # The forward FLOPs of one image as the run counted them (capsexp.run.model_cost), for the
        # model summary (capsexp.callbacks.model_summary); None when no run counted them.
        self.flops_per_image: int | None = None

    def setup(self, stage: str) -> None:
        """Lightning's hook before the module moves to its device: one accuracy and one set of loss
        means per test set the DataModule declares (:mod:`capsexp.records.metric_names`)."""
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        objects = getattr(datamodule, "objects_per_image", 1)
        if objects > 1 and not getattr(self.objective, "several_objects", False):
            raise ConfigError(
                f"the objective {type(self.objective).__name__} scores one class per image, but "
                f"{type(datamodule).__name__} has {objects} objects in each; choose a model whose objective "
                "takes several (CapsuleLoss: model=capsnet; CrossEntropy: model=lenet5 or model=baseline_cnn)"
            )
        names = list(getattr(datamodule, "test_set_names", None) or [PLAIN])
        if names == self.test_set_names and objects == self.objects_per_image and len(self.test_accuracy["per_set"]):
            return
        if objects != self.objects_per_image:
            self.objects_per_image = objects
            self.train_acc = accuracy_metric(self.num_classes, objects)
            self.val_acc = accuracy_metric(self.num_classes, objects)
        self.test_set_names = names
        self.test_accuracy["per_set"] = torch.nn.ModuleList(accuracy_metric(self.num_classes, objects) for _ in names)
        for name in names:
            for term in self.objective.terms:
                self.loss_means["test_terms"][_key(f"{term}{metric_suffix(name)}")] = MeanMetric()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The run's record, with the data's class names (read now: a dataset's may come from its files)."""
        if self.run_record is None:
            return
        names = getattr(self.trainer.datamodule, "class_names", None) if self._trainer is not None else None
        record = dataclasses.replace(self.run_record, class_names=list(names)) if names else self.run_record
        record.saved_in(checkpoint)

    def configure_model(self) -> None:
        """Lightning's hook before fit/validate/test: compile the net once, if asked."""
        if self.compile_net and not self._compiled:
            self.net.compile()
            self._compiled = True

    def forward(self, images: torch.Tensor, targets: torch.Tensor | None = None) -> Any:
        if self.net_takes_targets:
            return self.net(images, targets)
        return self.net(images)

    def _step(
        self, batch: Batch, stage: str, suffix: str = ""
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """The loss terms (logged), and the predicted and the present classes as the accuracy metric takes
        them: (N,) class indices each for one object per image, (N, classes) 0/1 each for several."""
        images, targets, *objects = batch
        # Only training feeds the labels forward: evaluation must not see them.
        output = self(images, targets if stage == "train" else None)
        scores = class_scores(output)
        if stage == "val" and self.val_presence is not None:
            self.val_presence.update(target_and_largest_other(scores.detach(), targets))
        terms = self.objective(output, objects[0] if objects else images, targets)
        for name, value in terms.items():
            logged_name = f"{stage}/{name}{suffix}"
            if stage == "train":
                # Step values are this process's own (no collective per step); the epoch mean,
                # train/<name>_epoch, is over all processes. Names as Lightning would give them.
                self.log(f"{logged_name}_step", value, on_step=True, on_epoch=False, prog_bar=name == "loss")
                logged_name += "_epoch"
            self._log_mean(
                stage,
                f"{name}{suffix}",
                logged_name,
                value.detach(),
                len(targets),
                prog_bar=stage == "val" and name == "loss",
            )
        if (targets.ndim == 2) != (self.objects_per_image > 1):
            raise ValueError(
                f"targets of shape {tuple(targets.shape)}, but the accuracy was set up for {self.objects_per_image} "
                "object(s) per image: setup reads the DataModule's objects_per_image"
            )
        if targets.ndim == 1:
            return terms, scores.argmax(dim=-1), targets
        predicted = multi_hot(scores.topk(targets.shape[1], dim=-1).indices, scores.shape[1])
        return terms, predicted.long(), multi_hot(targets, scores.shape[1]).long()

    def _log_mean(
        self, stage: str, term: str, logged_name: str, value: torch.Tensor, batch_size: int, prog_bar: bool
    ) -> None:
        """Log the mean of ``value`` (loss term ``term`` of ``stage``) over the epoch's images, on every process."""
        key = _key(term)
        means = self.loss_means[f"{stage}_terms"]
        if key not in means:
            raise KeyError(
                f"{logged_name}: the objective {type(self.objective).__name__} returned a term that is not in "
                f"its terms {tuple(self.objective.terms)}"
            )
        metric = means[key]
        metric.update(value, weight=batch_size)
        self.log(
            logged_name,
            metric,
            on_step=False,
            on_epoch=True,
            prog_bar=prog_bar,
            add_dataloader_idx=False,
        )

    def on_train_start(self) -> None:
        # configure_optimizers reads trainer.estimated_stepping_batches for a schedule over the run,
        # which sets up the training data before a resumed run's checkpoint is restored; Lightning
        # then never gives the loaders their saved position (Lightning-AI/pytorch-lightning#20550)
        # and the resumed run would start its epoch again. Here, after the restore, they get it, and
        # the data fetcher, which already drew a batch, starts again from there.
        fit_loop = self.trainer.fit_loop
        if fit_loop.restarting and fit_loop._combined_loader_states_to_load and fit_loop._data_fetcher is not None:
            fit_loop._load_combined_loader_states()
            iter(fit_loop._data_fetcher)

    def on_train_batch_start(self, batch: Batch, batch_idx: int) -> None:
        if self.margin_schedule is None:
            return
        batches = self.trainer.num_training_batches
        epoch = self.trainer.current_epoch + (batch_idx / batches if batches and math.isfinite(batches) else 0.0)
        total_steps = self.trainer.estimated_stepping_batches
        self.objective.margin = self.margin_schedule.margin(self.trainer.global_step, epoch, total_steps)
        self.log("train/margin", float(self.objective.margin))  # per step: the hook's default

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        terms, predicted, present = self._step(batch, "train")
        self.train_acc(predicted, present)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, prog_bar=True)
        return terms["loss"]

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        _, predicted, present = self._step(batch, "val")
        self.val_acc(predicted, present)
        self.log(VAL_ACC, self.val_acc, prog_bar=True)  # per epoch: validation's default

    def on_validation_epoch_end(self) -> None:
        presence = self._presence_medians()
        if self.trainer.sanity_checking:  # the sanity check must not count towards the best
            return
        self.val_acc_best(self.val_acc.compute())
        self.log(VAL_ACC_BEST, self.val_acc_best.compute(), prog_bar=True, sync_dist=True)
        for name, value in presence.items():
            self.log(presence_metric(name), value)  # the same on every process: CatMetric gathers

    @property
    def best_validation_accuracy(self) -> float | None:
        """The best validation accuracy of the run so far, earlier parts of a resumed run included (its
        state is saved in the checkpoint); None before any validation."""
        best = self.val_acc_best.max_value
        return float(best) if torch.isfinite(best) else None

    def _presence_medians(self) -> dict[str, torch.Tensor]:
        """Does a class score signal presence? The spread and margin losses ask for the target class
        near 1 and every other near 0: medians over the epoch's validation images (all processes) of
        the target's score, the largest other score and the gap between them."""
        if self.val_presence is None or not self.val_presence.update_count:
            return {}
        pairs = self.val_presence.compute().float()  # (images, 2)
        self.val_presence.reset()
        return {
            "gap": (pairs[:, 0] - pairs[:, 1]).median(),
            "target": pairs[:, 0].median(),
            "largest_other": pairs[:, 1].median(),
        }

    def test_step(self, batch: Batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        if dataloader_idx >= len(self.test_set_names):
            raise ValueError(
                f"test DataLoader {dataloader_idx} has no name: the DataModule declares "
                f"{len(self.test_set_names)} test sets in test_set_names"
            )
        suffix = metric_suffix(self.test_set_names[dataloader_idx])
        _, predicted, present = self._step(batch, "test", suffix)
        accuracy = self.test_accuracy["per_set"][dataloader_idx]
        accuracy(predicted, present)
        # test/acc: the first test set (for rotations, usually the unrotated one)
        names = [TEST_ACC] if dataloader_idx == 0 else []
        names += [f"{TEST_ACC}{suffix}"] if suffix else []
        for name in names:
            self.log(name, accuracy, add_dataloader_idx=False)  # per epoch: testing's default

    def parameter_groups(self) -> list[dict[str, Any]]:
        """The optimizer's parameter groups, one per learning-rate factor. With more than one, each is
        named by its factor, which names its rate in TensorBoard (``lr-Adam/x10``, ``lr-Adam/x1``)."""
        groups: dict[float, list[torch.nn.Parameter]] = {}
        for name, parameter in self.named_parameters():
            factor = self.lr_multipliers.get(name.rsplit(".", 1)[-1], 1.0)
            groups.setdefault(factor, []).append(parameter)
        named = len(groups) > 1
        return [
            {"params": params, "lr_multiplier": factor, **({"name": f"x{factor:g}"} if named else {})}
            for factor, params in groups.items()
        ]

    def configure_optimizers(self) -> Any:
        optimizer = self.optimizer(params=self.parameter_groups())
        # Set after construction so the optimizer's own lr (and its validation) stays the one base.
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * group["lr_multiplier"]
        if not self.lr_scheduler:
            return optimizer
        scheduler_config = dict(self.lr_scheduler)
        build = scheduler_config["scheduler"]
        # A schedule over the whole run (cosine_decay) is told the run's length in its own unit.
        if "total_steps" in inspect.signature(build).parameters:
            per_step = scheduler_config.get("interval", "epoch") == "step"
            total = self.trainer.estimated_stepping_batches if per_step else self.trainer.max_epochs
            if not math.isfinite(total) or total < 1:
                raise ConfigError(
                    f"model.lr_scheduler: a schedule over the run needs its length; set trainer.max_steps or "
                    f"trainer.max_epochs (now {total})"
                )
            build = functools.partial(build, total_steps=int(total))
        scheduler_config["scheduler"] = build(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": scheduler_config}


def target_and_largest_other(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(N, 2): each example's score of its target class (the lowest of them, with several objects) and
    the largest score of the other classes."""
    present = multi_hot(targets, scores.shape[1])
    target = scores.masked_fill(~present, torch.inf).amin(dim=1, keepdim=True)
    return torch.cat([target, scores.masked_fill(present, -torch.inf).amax(dim=1, keepdim=True)], dim=1)


def _key(term: str) -> str:
    """A loss term's name (``loss_rot22.5``) as a key of a ModuleDict, which may not hold a "."."""
    return term.replace(".", "_")


def accuracy_metric(num_classes: int, objects_per_image: int) -> Metric:
    """The fraction of images whose predicted classes are exactly the present ones: for one object per
    image the usual accuracy of (N,) class indices; for several, the exact match of (N, classes) 0/1."""
    if objects_per_image == 1:
        return MulticlassAccuracy(num_classes, average="micro")
    return MultilabelExactMatch(num_classes)
