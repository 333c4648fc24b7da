"""LightningModules wrapping the pure ``torch.nn`` nets."""

from capsexp.lit.classifier import Classifier
from capsexp.lit.objectives import CapsuleLoss, CrossEntropy, SpreadLoss, class_scores

__all__ = ["CapsuleLoss", "Classifier", "CrossEntropy", "SpreadLoss", "class_scores"]
