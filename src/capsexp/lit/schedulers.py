"""Learning-rate schedules built from ``torch.optim.lr_scheduler``."""

from __future__ import annotations

from torch.optim import Optimizer
from torch.optim.lr_scheduler import ExponentialLR, LRScheduler, StepLR

from capsexp.arguments import PositiveFraction, PositiveInt, checked


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
