"""Training objectives: map a net's output to named loss terms.

An objective is called as ``objective(output, images, targets)`` and returns a dict of scalar
tensors whose ``"loss"`` entry is optimised; every entry is logged as ``<stage>/<name>``. Capsule
objectives add their parts (``margin_loss``, ``recon_loss``) beside the total. ``terms`` names every
entry an objective may return, so that the Classifier makes their metrics once, up front.
``presence_scores`` says whether the class scores it works on are presence probabilities in [0, 1]
(capsule lengths, capsule activations) rather than logits: the Classifier then logs how far the
present class stands above the others.

``targets`` are (N,) class indices, or (N, T) for T objects per image (MultiMNIST); ``images`` are what
reconstructions are compared with: the inputs, or with T objects each object alone, (N, T, C, H, W).
``several_objects`` says whether an objective takes (N, T) targets.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from pydantic import NonNegativeFloat

from capsexp.config.arguments import PositiveFraction, UnitInterval, checked
from capsexp.models.inspection import class_scores
from capsexp.nn.functional import margin_loss, spread_loss


def multi_hot(targets: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(N, classes) bool: the classes present in each image, from (N,) or (N, T) class indices."""
    present = F.one_hot(targets, num_classes).bool()
    return present.any(dim=1) if targets.ndim == 2 else present


@checked
class CrossEntropy:
    """Softmax cross-entropy on the class scores (the LeNet5 baseline's objective); with several objects
    per image, a binary cross-entropy on each class's independent sigmoid (the baseline of Sabour et
    al. 2017 on MultiMNIST, section 6)."""

    terms = ("loss",)
    presence_scores = False
    several_objects = True

    def __init__(self, label_smoothing: UnitInterval = 0.0) -> None:
        self.label_smoothing = label_smoothing

    def __call__(self, output: Any, images: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        scores = class_scores(output)
        if targets.ndim == 2:
            present = multi_hot(targets, scores.shape[1]).to(scores.dtype)
            smoothed = present * (1 - self.label_smoothing) + self.label_smoothing / 2
            return {"loss": F.binary_cross_entropy_with_logits(scores, smoothed)}
        return {"loss": F.cross_entropy(scores, targets, label_smoothing=self.label_smoothing)}


@checked
class CapsuleLoss:
    """Margin loss (Eq. 4) plus the reconstruction regulariser (section 4.1).

    loss = margin_loss + recon_weight * sum of squared pixel errors per image, averaged over the batch
    (paper: recon_weight = 0.0005, "so that it does not dominate the margin loss"). Logged terms:
    ``margin_loss`` and ``recon_loss`` (the unweighted per-image sum of squared errors). With several
    objects per image, every present class counts in the margin loss and each object's reconstruction
    is compared with that object alone (section 6: both reconstruction losses, summed).
    """

    terms = ("loss", "margin_loss", "recon_loss")
    presence_scores = True  # the lengths of the class capsules
    several_objects = True

    def __init__(
        self,
        m_pos: UnitInterval = 0.9,
        m_neg: UnitInterval = 0.1,
        lambda_: NonNegativeFloat = 0.5,
        recon_weight: NonNegativeFloat = 0.0005,
    ) -> None:
        self.m_pos, self.m_neg, self.lambda_, self.recon_weight = m_pos, m_neg, lambda_, recon_weight

    @property
    def presence_threshold(self) -> float:
        """The score halfway between the margin loss's targets for a present class (m+) and an absent one
        (m-): a class scoring below it on an image is taken as absent (0.5 with the paper's 0.9 and 0.1)."""
        return (self.m_pos + self.m_neg) / 2

    def __call__(self, output: Any, images: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        margin = margin_loss(class_scores(output), targets, self.m_pos, self.m_neg, self.lambda_)
        reconstructions = getattr(output, "reconstructions", None)
        if reconstructions is None or self.recon_weight == 0:
            return {"loss": margin, "margin_loss": margin}
        recon = (reconstructions - images).pow(2).flatten(1).sum(dim=1).mean()
        return {"loss": margin + self.recon_weight * recon, "margin_loss": margin, "recon_loss": recon}


@checked
class ActivationNLL:
    """The negative log-likelihood of the target class under the class activations normalised to sum to
    one, -log(a_t / sum_j a_j): self-routing's loss (Hahn et al. 2019). coder3000/SR-CapsNet takes the
    log of the class activations, which under self-routing already sum to one
    (a_j = sum_i c_ij a_i / sum_i a_i), and divides the dynamic- and EM-routing heads' lengths and
    activations by their sum first, as here, so that every head it compares trains with this loss.
    Logged term: ``nll``."""

    terms = ("loss", "nll")
    presence_scores = True  # the activations of the class capsules
    several_objects = False  # one target class per image

    # Keeps the log finite for an activation that underflowed to 0.
    EPS = 1e-12

    def __call__(self, output: Any, images: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        scores = class_scores(output)
        log_shares = (scores + self.EPS).log() - (scores.sum(dim=1, keepdim=True) + self.EPS).log()
        loss = F.nll_loss(log_shares, targets)
        return {"loss": loss, "nll": loss}


@checked
class SpreadLoss:
    """Spread loss of the EM-routing paper (section 3.1) on the class activations.

    ``margin`` starts at 0.2 and is raised during training by the Classifier's margin schedule
    (:mod:`capsexp.lit.margin`); logged term: ``spread_loss``.
    """

    terms = ("loss", "spread_loss")
    presence_scores = True  # the activations of the class capsules
    several_objects = False  # the paper defines it for one target class

    def __init__(self, margin: PositiveFraction = 0.2) -> None:
        self.margin = margin

    def __call__(self, output: Any, images: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        loss = spread_loss(class_scores(output), targets, self.margin)
        return {"loss": loss, "spread_loss": loss}
