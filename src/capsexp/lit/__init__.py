"""LightningModules wrapping the pure ``torch.nn`` nets."""

from capsexp.lit.classifier import Classifier
from capsexp.lit.objectives import ActivationNLL, CapsuleLoss, CrossEntropy, SpreadLoss, class_scores

__all__ = ["ActivationNLL", "CapsuleLoss", "Classifier", "CrossEntropy", "SpreadLoss", "class_scores"]
