"""Checks of a checkpoint given as ``ckpt_path`` before Lightning loads it.

Lightning's own failures read as PyTorch internals ("PytorchStreamReader failed reading zip
archive", or advice to retry with ``weights_only=False``, which would let an untrusted file run code).
Here a file that is missing, empty, not a checkpoint, not a Lightning checkpoint or saved from
another model gets one short message. The file is only ever read with ``weights_only=True``.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from capsexp.errors import CheckpointError
from capsexp.results.metric_names import VAL_ACC

RUN_CONFIG = Path(".hydra") / "config.yaml"  # a run folder's composed config
# ckpt_path values that Lightning resolves itself ("last" checkpoint of this run, ...).
LIGHTNING_ALIASES = ("last", "best", "hpc", "registry")
# torch.load(weights_only=True) puts the cause of an unpickling failure after this.
_UNPICKLER_CAUSE = "WeightsUnpickler error:"
_LINE_LIMIT = 160  # characters of an underlying error quoted in a message


def check_checkpoint(ckpt_path: str | Path, module: nn.Module | None = None, where: str | None = None) -> dict | None:
    """Raise :class:`CheckpointError` unless ``ckpt_path`` is a Lightning checkpoint whose weights fit
    ``module`` (same parameter names and shapes); return the checkpoint, read (memory-mapped) on the CPU,
    or None for an alias Lightning resolves itself. ``where``: the option that named the file, as the
    messages begin (``ckpt_path=<file>`` unless given)."""
    if str(ckpt_path) in LIGHTNING_ALIASES:
        return None
    path = Path(ckpt_path)
    where = where or f"ckpt_path={ckpt_path}"
    if path.is_dir():
        found = sorted(path.glob("*.ckpt")) or sorted(path.glob("checkpoints/*.ckpt"))
        hint = f"; it holds {', '.join(p.name for p in found[:3])}" if found else ""
        raise CheckpointError(f"{where} is a folder: give a .ckpt file{hint}")
    if not path.is_file():
        raise CheckpointError(
            f"{where}: no such file. A run's checkpoints are in "
            f"logs/<task_name>/runs/<time>/checkpoints/ (last.ckpt, and the best by {VAL_ACC})"
        )
    if path.stat().st_size == 0:
        raise CheckpointError(f"{where} is empty (0 bytes): the run that wrote it stopped while saving?")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive
        raise CheckpointError(f"{where} is not a PyTorch checkpoint (not in torch.save's format, or truncated)")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as error:
        # The weights-only unpickler's every failure starts with advice to retry with weights_only=False;
        # the cause follows it: a class it will not import ("Unsupported global"), or unreadable data.
        cause = str(error).rpartition(_UNPICKLER_CAUSE)[2]  # the whole message if it has no such part
        if "Unsupported global" in cause:
            raise CheckpointError(
                f"{where} holds Python objects other than tensors and plain values. capsexp loads "
                "checkpoints without running code from them and will not load this one; checkpoints "
                "written by capsexp never need that."
            ) from None
        raise CheckpointError(f"{where} is a damaged PyTorch checkpoint ({_first_line(cause, error)})") from None
    except Exception as error:  # a damaged archive: one line, not PyTorch's advice
        raise CheckpointError(f"{where} is a damaged PyTorch checkpoint ({_first_line(str(error), error)})") from None
    if (
        not isinstance(checkpoint, dict)
        or "state_dict" not in checkpoint
        or "pytorch-lightning_version" not in checkpoint
    ):
        raise CheckpointError(
            f"{where} is a PyTorch file but not a Lightning checkpoint (no state_dict or "
            "pytorch-lightning_version in it): give a .ckpt written by a capsexp run"
        )
    if module is not None:
        _check_weights_fit(where, checkpoint["state_dict"], module)
    return checkpoint


def _check_weights_fit(where: str, saved: dict[str, torch.Tensor], module: nn.Module) -> None:
    expected = {name: tuple(tensor.shape) for name, tensor in module.state_dict().items()}
    found = {name: tuple(tensor.shape) for name, tensor in saved.items()}
    missing = [name for name in expected if name not in found]
    unexpected = [name for name in found if name not in expected]
    mismatched = [name for name in expected if name in found and expected[name] != found[name]]
    if not (missing or unexpected or mismatched):
        return
    if mismatched:
        name = mismatched[0]
        first = f"{name} is {_shape(found[name])} in the checkpoint, {_shape(expected[name])} in this model"
    elif missing:
        first = f"this model's {missing[0]} is not in the checkpoint"
    else:
        first = f"the checkpoint's {unexpected[0]} is not in this model"
    net = type(getattr(module, "net", module)).__name__
    raise CheckpointError(
        f"{where} was saved from another model than this run's {net} "
        f"({len(missing) + len(unexpected) + len(mismatched)} weights differ; {first}).\n"
        "Use the model and data options of the run that wrote it "
        "(its .hydra/config.yaml, two folders up from checkpoints/)."
    )


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


def _first_line(text: str, error: Exception) -> str:
    """The first line of ``text`` (an error's message, or part of it), at most 160 characters; the
    error's type when the text is blank."""
    lines = text.strip().splitlines()
    return lines[0][:_LINE_LIMIT] if lines else type(error).__name__


def model_of_run(ckpt_path: str | Path, where: str) -> tuple[Any, Any]:
    """The model of the run that saved ``ckpt_path`` (``<run>/checkpoints/<file>.ckpt``), built from the
    run's ``.hydra/config.yaml`` (``where`` names the key in messages) with the checkpoint's weights,
    and that config."""
    from capsexp.run.build import build_model

    cfg = run_config(ckpt_path, where)
    module = build_model(where, cfg.model)
    module.load_state_dict(check_checkpoint(ckpt_path, module, where)["state_dict"])
    return module, cfg


def run_config(ckpt_path: str | Path, where: str) -> Any:
    """The composed config (``.hydra/config.yaml``) of the run that saved ``ckpt_path``
    (``<run>/checkpoints/<file>.ckpt``); :class:`CheckpointError` naming ``where`` when it is not there."""
    from omegaconf import OmegaConf

    config_file = Path(ckpt_path).resolve().parent.parent / RUN_CONFIG
    if not config_file.is_file():
        raise CheckpointError(
            f"{where}: no run config at {config_file}. The checkpoint must sit inside the folder of the run "
            "that wrote it (<run>/checkpoints/*.ckpt): its .hydra/config.yaml builds its model."
        )
    return OmegaConf.load(config_file)


def best_checkpoint(run: Path) -> Path:
    """The run's best checkpoint by validation accuracy (the one beside ``last.ckpt``)."""
    found = [p for p in sorted((run / "checkpoints").glob("*.ckpt")) if p.name != "last.ckpt"]
    if not found:
        raise CheckpointError(f"{run} saved no best checkpoint (did it validate?)")
    return found[0]
