"""Learning-rate schedules built from ``torch.optim.lr_scheduler``."""

from __future__ import annotations

from pydantic import PositiveInt
from torch.optim import Optimizer
from torch.optim.lr_scheduler import CosineAnnealingLR, ExponentialLR, LRScheduler, StepLR

from capsexp.config.arguments import PositiveFraction, checked


@checked
def exponential_decay(
    optimizer: Optimizer, decay_rate: PositiveFraction = 0.96, decay_steps: PositiveInt = 2000, staircase: bool = False
) -> LRScheduler:
    """lr_t = lr_0 * decay_rate^(t / decay_steps), with t counted in scheduler steps.

    The schedule of the official CapsNet and EM-routing code (``tf.train.exponential_decay``).
    Smooth: an :class:`ExponentialLR` with gamma = decay_rate^(1 / decay_steps), stepped every ``t``.
    ``staircase``: a :class:`StepLR` that multiplies by ``decay_rate`` every ``decay_steps``.
    """
    if staircase:
        return StepLR(optimizer, step_size=decay_steps, gamma=decay_rate)
    return ExponentialLR(optimizer, gamma=decay_rate ** (1.0 / decay_steps))


@checked
def cosine_decay(optimizer: Optimizer, total_steps: PositiveInt) -> LRScheduler:
    """lr_t = lr_0 * (1 + cos(pi * t / total_steps)) / 2: from lr_0 down to 0 over the run.

    Cosine annealing without restarts (Loshchilov & Hutter 2017), a :class:`CosineAnnealingLR`.
    ``total_steps`` is the run's number of scheduler steps, which the Classifier supplies from the
    trainer (``Trainer.estimated_stepping_batches`` per step, ``max_epochs`` per epoch).
    """
    return CosineAnnealingLR(optimizer, T_max=total_steps)
