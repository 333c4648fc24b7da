"""What a model costs, as a run reports it before training: its parameters and its forward FLOPs per image."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def forward_flops_per_image(module: nn.Module, channels: int, image_size: int) -> int:
    """The FLOPs of one image's forward pass in evaluation (``torch.utils.flop_counter``: matrix products
    and convolutions, 2 per multiply-add; element-wise work is not counted), on a blank image. The net
    (``module.net`` where it has one) is put back in the mode it was in."""
    net = getattr(module, "net", module)
    training = net.training
    image = torch.zeros(1, channels, image_size, image_size, device=next(net.parameters()).device)
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            net.eval()(image)
    finally:
        net.train(training)
    return counter.get_total_flops()
