"""The model summary a run prints: the metrics the run uses (one object per image: the usual accuracy,
no multi-label metric) and capsexp's own FLOP count in place of Lightning's, which is 0 without an
example input."""

from __future__ import annotations

import functools
import re
from types import SimpleNamespace

import torch
from torchmetrics.classification import MulticlassAccuracy, MultilabelExactMatch

from capsexp.lit import Classifier, CrossEntropy
from capsexp.models import LeNet5
from tests.helpers import TINY_RUN, run_cli_in_process


def lenet5_forward_flops() -> int:
    """LeNet5 on a 28x28 MNIST image, 2 FLOPs per multiply-add, worked out from its layers' shapes."""
    conv1 = 6 * 28 * 28 * (1 * 5 * 5)  # 6 maps of 28x28 (padding 2), each output a 1x5x5 window
    conv2 = 16 * 10 * 10 * (6 * 5 * 5)  # pooled to 14x14, then 5x5 unpadded: 16 maps of 10x10
    fully_connected = (16 * 5 * 5) * 120 + 120 * 84 + 84 * 10  # pooled to 16x5x5, flattened
    return 2 * (conv1 + conv2 + fully_connected)  # 833,040


def test_the_summary_of_a_single_label_run_names_its_accuracy_and_capsexps_flops(mnist_dir, tmp_path):
    result = run_cli_in_process(
        *(o for o in TINY_RUN if o != "callbacks.model_summary=null"),
        "model=lenet5",
        f"paths.data_dir={mnist_dir}",
        "trainer.max_steps=1",
        "trainer.limit_train_batches=1",  # an epoch of 1 step, then a validation
        "trainer.limit_val_batches=1",
        "test=false",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout + result.stderr
    assert re.search(r"│ train_acc +│ MulticlassAccuracy +│", printed), printed[-4000:]
    assert re.search(r"│ val_acc +│ MulticlassAccuracy +│", printed)
    assert "Multilabel" not in printed
    flops = [line.strip() for line in printed.splitlines() if "FLOPs" in line and "capsexp.run.stages" not in line]
    assert flops == [f"Forward FLOPs per image: {lenet5_forward_flops():,} (matrix products and convolutions)"]
    assert "0.8 MFLOPs per image (forward)" in printed  # the run's first lines: the same count


def test_the_accuracy_is_the_multi_label_exact_match_only_for_several_objects_per_image():
    module = Classifier(LeNet5(), CrossEntropy(), functools.partial(torch.optim.SGD, lr=0.1), num_classes=10)
    for objects, kind in [(2, MultilabelExactMatch), (1, MulticlassAccuracy)]:
        module._trainer = SimpleNamespace(datamodule=SimpleNamespace(objects_per_image=objects))
        module.setup("fit")
        assert all(
            type(metric) is kind for metric in [module.train_acc, module.val_acc, *module.test_accuracy["per_set"]]
        )
