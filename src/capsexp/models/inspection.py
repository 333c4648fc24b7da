"""What the rest of capsexp reads off any net: its class scores, and its routing layers."""

from __future__ import annotations

from typing import Any

import torch

from capsexp.nn import ClassMatrixCapsules, ConvMatrixCapsules, RoutingCapsules

ROUTING_LAYERS = (ConvMatrixCapsules, ClassMatrixCapsules, RoutingCapsules)


def class_scores(output: Any) -> torch.Tensor:
    """The (batch, classes) scores of a net's output: the output itself, or its ``scores`` field."""
    return output if isinstance(output, torch.Tensor) else output.scores


def routing_layers(module: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The routing layers of a module, by their name relative to its ``net``: each has a ``router`` whose
    forward returns (poses, parent activations, assignment)."""
    return {
        name.removeprefix("net."): layer for name, layer in module.named_modules() if isinstance(layer, ROUTING_LAYERS)
    }
