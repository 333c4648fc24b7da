"""Training objectives: map a net's output to named loss terms.

An objective is called as ``objective(output, images, targets)`` and returns a dict of scalar
tensors whose ``"loss"`` entry is optimised; every entry is logged as ``<stage>/<name>``. Capsule
objectives add their parts (``margin_loss``, ``recon_loss``) beside the total.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def class_scores(output: Any) -> torch.Tensor:
    """The (batch, classes) scores of a net's output: the output itself, or its ``scores`` field."""
    return output if isinstance(output, torch.Tensor) else output.scores


class CrossEntropy:
    """Softmax cross-entropy on the class scores (the LeNet5 baseline's objective)."""

    def __init__(self, label_smoothing: float = 0.0) -> None:
        self.label_smoothing = label_smoothing

    def __call__(self, output: Any, images: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": F.cross_entropy(class_scores(output), targets, label_smoothing=self.label_smoothing)}
