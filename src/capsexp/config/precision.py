"""``trainer.precision=auto``: the precision a run trains in, chosen per net and per machine.

bf16-mixed (Lightning's ``torch.autocast`` to bfloat16; routing, squash, the losses and the metrics stay
in float32 inside it) where the equivalence page backs it for the net
(``experiments/results/precision_equivalence_quick/``: five seeds a side, paired differences of test
accuracy and presence gap within 0.3 points by two one-sided tests) and bf16 arithmetic is native on the
device; float32 (``32-true``) everywhere else. Any Lightning precision given by name runs as given.
"""

from __future__ import annotations

from dataclasses import dataclass

AUTO = "auto"
BF16 = "bf16-mixed"
FLOAT32 = "32-true"

# The nets whose bf16-mixed training the equivalence page shows equivalent to float32 (its verdict
# column; the page's rebuild checks this set against it). A net not named here trains in float32
# under auto.
BF16_NETS: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Precision:
    """What a run trains in (``lightning``, a Lightning precision) and, where ``auto`` chose it, why
    (one line for the log; empty for a precision given by name)."""

    lightning: str
    reason: str


def bf16_native(accelerator: str = "auto") -> bool:
    """Whether bf16 arithmetic is native where the run computes: a CUDA device that supports it, or a CPU
    with AVX-512 BF16 or AMX. Elsewhere bf16 autocast falls back to slow paths: on an AVX2-only CPU a
    256-channel 5x5 convolution took over a minute in bf16 against 1.3 s in float32."""
    import torch

    on_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    if on_gpu:
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if accelerator not in ("cpu", "auto"):
        return False  # mps, tpu, ...: not measured
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def resolve(precision: str | int, net_target: str | None, accelerator: str = "auto") -> Precision:
    """The precision of ``trainer.precision`` for a net (its ``_target_``) on an accelerator."""
    if str(precision) != AUTO:
        return Precision(str(precision), "")
    net = (net_target or "?").rpartition(".")[2]
    if net_target not in BF16_NETS:
        return Precision(FLOAT32, f"auto: {net} is not among the nets the precision equivalence page backs in bf16")
    if not bf16_native(accelerator):
        return Precision(FLOAT32, f"auto: bf16 arithmetic is not native on this {accelerator} device")
    return Precision(BF16, f"auto: {net} in bf16 where the precision equivalence page backs it, native here")
