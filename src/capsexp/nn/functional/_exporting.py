"""Whether a graph of the model is being captured for export (``torch.export``, which ONNX's exporter
runs, or ``torch.jit.trace``): the capsule ops then take their plain forward paths, which the exporters
trace into a graph, instead of the custom autograd functions and batch chunking that serve training."""

from __future__ import annotations

import torch


def exporting() -> bool:
    return torch.compiler.is_exporting() or torch.jit.is_tracing()
