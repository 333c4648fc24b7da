"""``trainer.precision=auto``: the precision a run trains in, chosen per model config and per machine.

bf16-mixed (Lightning's ``torch.autocast`` to bfloat16; votes, routing, squash, the losses and the metrics
stay in float32 inside it) for the model configs an equivalence page backs, with the routing it tested
(``experiments/results/precision_equivalence_<budget>/``: paired differences of test accuracy and presence
gap within the margin of :mod:`capsexp.studies.precision` by two one-sided tests, Holm over the page), where
bf16 arithmetic is native on the device; float32 (``32-true``) everywhere else. Any Lightning precision given
by name runs as given.
"""

from __future__ import annotations

from dataclasses import dataclass

AUTO = "auto"
BF16 = "bf16-mixed"
FLOAT32 = "32-true"

# model config: the routing (model.net.routing's _target_; None for a net without one) with which an
# equivalence page backs its bf16-mixed training and bf16 changes what it computes (the pages' verdicts:
# capsnet_small on the quick budget's, capsnet on the capsnet budget's; each page's rebuild checks this
# table against it). Any other model, or routing, trains in float32 under auto.
BF16_MODELS: dict[str, str | None] = {
    "capsnet": "capsexp.nn.UniformRouting",
    "capsnet_small": "capsexp.nn.DynamicRouting",
}


@dataclass(frozen=True)
class Precision:
    """What a run trains in (``lightning``, a Lightning precision) and, where ``auto`` chose it, why
    (one line for the log; empty for a precision given by name)."""

    lightning: str
    reason: str


def bf16_native(accelerator: str = "auto") -> bool:
    """Whether bf16 arithmetic is native where the run computes: a CUDA device that supports it, or a CPU
    with AVX-512 BF16 or AMX. Elsewhere bf16 autocast falls back to slow paths: on an AVX2-only CPU a
    convolution in bf16 takes many times as long as in float32."""
    import torch

    on_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    if on_gpu:
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if accelerator not in ("cpu", "auto"):
        return False  # mps, tpu, ...: not measured
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def resolve(precision: str | int, model: str | None, routing: str | None, accelerator: str = "auto") -> Precision:
    """The precision of ``trainer.precision`` for a model config (its name, ``model=<name>``; None where
    unknown) with a routing (``model.net.routing._target_``; None for a net without one) on an accelerator."""
    if str(precision) != AUTO:
        return Precision(str(precision), "")
    shown = f"model={model}" + (f" with {routing.rpartition('.')[2]}" if routing else "")
    if model not in BF16_MODELS or BF16_MODELS[model] != routing:
        return Precision(FLOAT32, f"auto: {shown} is not what the precision equivalence page backs in bf16")
    if not bf16_native(accelerator):
        return Precision(
            FLOAT32, f"auto: {shown} is backed in bf16, but bf16 arithmetic is not native on this {accelerator} device"
        )
    return Precision(BF16, f"auto: {shown} in bf16, as the precision equivalence page backs it, native here")


def routing_of(model_config) -> str | None:
    """The routing a model config's net routes with (its ``_target_``), None for a net without one."""
    routing = (model_config.get("net") or {}).get("routing")
    return routing.get("_target_") if routing else None
