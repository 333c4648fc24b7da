"""LightningModules wrapping the pure ``torch.nn`` nets."""

from capsexp.lit.classifier import Classifier
from capsexp.lit.objectives import CapsuleLoss, CrossEntropy, class_scores

__all__ = ["CapsuleLoss", "Classifier", "CrossEntropy", "class_scores"]
