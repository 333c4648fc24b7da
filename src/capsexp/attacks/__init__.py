"""Adversarial attacks on trained classifiers (``attack=fgsm|bim|pgd``), built on foolbox."""

from capsexp.attacks.evaluation import AdversarialEvaluation, AttackResult, PixelClassifier

__all__ = ["AdversarialEvaluation", "AttackResult", "PixelClassifier"]
