"""The one reader of checkpoint files: a checkpoint checked before Lightning loads it, the model of the
run that saved it built from its record, and the run folder's best checkpoint found.

Lightning's own failures read as PyTorch internals ("PytorchStreamReader failed reading zip
archive", or advice to retry with ``weights_only=False``, which would let an untrusted file run code).
Here a file that is missing, empty, not a checkpoint, not a Lightning checkpoint or saved from
another model gets one short message. The file is only ever read with ``weights_only=True``.
"""

from __future__ import annotations

import pickle
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath
from typing import TYPE_CHECKING, Any

from capsexp.errors import CheckpointError
from capsexp.locations import LAST_CHECKPOINT, RUN_CONFIG
from capsexp.records.metric_names import VAL_ACC
from capsexp.records.run_record import RunRecord

if TYPE_CHECKING:  # torch is imported where a file is read: a missing one is named before torch loads
    import torch
    from torch import nn

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
    where = where or f"ckpt_path={ckpt_path}"
    checkpoint = read_checkpoint(ckpt_path, where)
    if module is not None:
        check_weights_fit(where, checkpoint["state_dict"], module)
    return checkpoint


def read_checkpoint(ckpt_path: str | Path, where: str) -> dict:
    """The Lightning checkpoint file ``ckpt_path``, read once (memory-mapped, on the CPU, weights only);
    :class:`CheckpointError` naming ``where`` for a file that is missing, empty, damaged or not one."""
    path = Path(ckpt_path)
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
    import torch  # here: a command can name a missing file before torch has loaded

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
    return checkpoint


def check_weights_fit(where: str, saved: dict[str, torch.Tensor], module: nn.Module) -> None:
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


def peek(file: str | Path) -> dict | None:
    """The checkpoint ``file`` holds, or None where it cannot be read: for what a run folder records
    (its best checkpoint's name, its overrides, its step), where an unreadable file records nothing and
    the run that reads it as a model says why (:func:`read_checkpoint`)."""
    import torch

    try:
        checkpoint = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return None
    return checkpoint if isinstance(checkpoint, dict) else None


@dataclass
class RunOfCheckpoint:
    """What :func:`model_of_run` rebuilds: the LightningModule with the checkpoint's weights, the run's
    config, its record (None for a checkpoint older than the record), the file read, and a note when that
    file is not the path given itself (a run folder's best checkpoint)."""

    module: Any
    config: Any
    record: RunRecord | None
    file: Path
    note: str | None = None


def model_of_run(path: str | Path, where: str) -> RunOfCheckpoint:
    """The model of the run that saved the checkpoint ``path`` names (a file, or a run folder's best:
    :func:`checkpoint_of`), built from the config the checkpoint records (a checkpoint older than that
    record: its run folder's ``.hydra/config.yaml``; ``where`` names the key in messages) with the
    checkpoint's weights. The file is read once."""
    from capsexp.config.instantiation import build_model

    if str(path) in LIGHTNING_ALIASES:
        raise CheckpointError(f"{where}: give a checkpoint file or a run folder")
    file, note = checkpoint_of(path, where)
    checkpoint = read_checkpoint(file, where)
    config = recorded_config(checkpoint, file, where)
    module = build_model(where, config.model)
    check_weights_fit(where, checkpoint["state_dict"], module)  # a clear message where they do not fit
    module.load_state_dict(checkpoint["state_dict"])
    return RunOfCheckpoint(module, config, RunRecord.of(checkpoint), file, note)


def recorded_config(checkpoint: dict, ckpt_path: str | Path, where: str) -> Any:
    """The resolved config of the run that saved ``checkpoint``: its own record (:class:`RunRecord`), or for
    a checkpoint older than that record, its run folder's (:func:`run_config`)."""
    from omegaconf import OmegaConf

    record = RunRecord.of(checkpoint)
    if record is not None:
        return OmegaConf.create(record.config)
    from capsexp.config.hydra_setup import register

    register()  # the resolvers a run folder's unresolved config calls
    return run_config(ckpt_path, where)


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


def checkpoint_of(path: str | Path, where: str | None = None) -> tuple[Path, str | None]:
    """The checkpoint ``path`` names, and a note when it is not the file itself: a run or sweep job folder
    means the checkpoint its run recorded as best (:func:`best_checkpoint`), or ``last.ckpt`` where the
    run never validated; a file is itself. :class:`CheckpointError` for a folder without checkpoints."""
    path = Path(path)
    where = where or f"ckpt_path={path}"
    if not path.is_dir():
        return path, None
    try:
        return best_with_note(path)
    except CheckpointError:
        pass
    if (path / LAST_CHECKPOINT).is_file():
        return path / LAST_CHECKPOINT, f"{LAST_CHECKPOINT.name}: the run saved no best checkpoint (it never validated)"
    found = sorted(path.glob("*.ckpt"))
    hint = f"; give one of its files: {', '.join(p.name for p in found[:3])}" if found else ""
    raise CheckpointError(
        f"{where} is a folder without a run's checkpoints (no checkpoints/*.ckpt in it): give a run "
        f"folder (logs/<task_name>/runs/<time>...) or a .ckpt file{hint}"
    )


def best_checkpoint(run: Path) -> Path:
    """The run's best checkpoint by validation accuracy, the one it tested (:func:`best_with_note`)."""
    return best_with_note(run)[0]


def best_with_note(run: Path) -> tuple[Path, str]:
    """The checkpoint the run recorded as its best by validation accuracy: ``best_model_path`` in the
    ModelCheckpoint state of its latest checkpoint (``last.ckpt``, else the newest), the one the run
    tested, found by name in the run's ``checkpoints/`` (a run folder may have moved); and a note naming
    it. Where no checkpoint records one (or its file is gone), the newest of the others, with a note that
    says so. :class:`CheckpointError` when the run saved no checkpoint beside ``last.ckpt``."""
    folder = run / LAST_CHECKPOINT.parent
    saved = sorted((p for p in folder.glob("*.ckpt") if p.name != LAST_CHECKPOINT.name), key=_step_and_name)
    if not saved:
        raise CheckpointError(f"{run} saved no best checkpoint (did it validate?)")
    latest = [folder / LAST_CHECKPOINT.name] if (folder / LAST_CHECKPOINT.name).is_file() else []
    for file in [*latest, *reversed(saved)]:
        best = _recorded_best(file)
        if best is not None and (folder / best).is_file():
            return folder / best, f"its best checkpoint by {VAL_ACC}, {best}, {RECORDED}"
        if best is not None:
            break  # recorded, but not in this folder: the newest, below
    return saved[-1], (
        f"{saved[-1].name}, its newest checkpoint beside {LAST_CHECKPOINT.name}: no checkpoint of the run records "
        f"which was best by {VAL_ACC}"
    )


RECORDED = "as the run recorded it"  # ends the note of a run folder's best checkpoint, found as recorded


def _step_and_name(path: Path) -> tuple[int, str]:
    """Checkpoints in the order they were written: by the step in their name (``..._step_000120``), then name."""
    digits = re.findall(r"step[_=]?(\d+)", path.stem)
    return (int(digits[-1]) if digits else -1, path.name)


def _recorded_best(file: Path) -> str | None:
    """The file name of ``best_model_path`` in the ModelCheckpoint state ``file`` holds (None where it
    holds none, or cannot be read)."""
    checkpoint = peek(file)
    states = checkpoint.get("callbacks", {}) if checkpoint is not None else {}
    for name, state in states.items():
        if "Checkpoint{" in str(name):  # Lightning keys a ModelCheckpoint's state by its class and settings
            path = state.get("best_model_path") if isinstance(state, dict) else None
            if path:
                return PureWindowsPath(path).name  # splits at either separator: a path written on any system
    return None
