"""LightningModules wrapping the pure ``torch.nn`` nets."""

from capsexp.lit.classifier import Classifier
from capsexp.lit.objectives import CrossEntropy, class_scores

__all__ = ["Classifier", "CrossEntropy", "class_scores"]
