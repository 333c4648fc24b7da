"""The composed config, checked before anything is built or any data is read: each node with a
``_target_`` against the hints of what it builds (:mod:`capsexp.config.arguments`), a torch optimizer by torch
itself, the top-level keys against :class:`JobOptions`; here only the rules that tie
several keys together."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from annotated_types import MinLen
from hydra.utils import get_object
from omegaconf import DictConfig, MissingMandatoryValue, OmegaConf

from capsexp.config.arguments import argument_problems, shown
from capsexp.config.precision import AUTO
from capsexp.errors import CapsexpError, ConfigError

_SHOWN = 8  # problems listed; the rest are counted


@dataclass(frozen=True)
class JobOptions:
    """The values the top-level keys of ``conf/config.yaml`` allow (checked here; the defaults
    are in the YAML)."""

    train: bool
    test: bool
    ckpt_path: Annotated[str, MinLen(1)] | None
    seed: int | None
    task_name: Annotated[str, MinLen(1)]  # the folder under the log dir
    tags: list[str] | None
    # torch.set_float32_matmul_precision on GPUs
    float32_matmul_precision: Literal["highest", "high", "medium"]
    optimized_metric: Annotated[str, MinLen(1)] | None  # e.g. val/acc_best


def _value(cfg: DictConfig, key: str) -> Any:
    """The resolved value at ``key`` as plain Python, None when absent, or the error it raises."""
    try:
        value = OmegaConf.select(cfg, key, throw_on_missing=True)
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    except Exception as error:
        return error


def _node_problems(cfg: DictConfig, path: str, node: dict) -> list[str]:
    """Problems of the node at ``path`` (ending in a dot), then of the nodes under it."""
    problems = _target_problems(cfg, path, node) if "_target_" in node else []
    for key, child in node.items():
        if isinstance(child, dict):
            problems += _node_problems(cfg, f"{path}{key}.", child)
    return problems


def _target_problems(cfg: DictConfig, path: str, node: dict) -> list[str]:
    try:
        target = get_object(_value(cfg, f"{path}_target_"))
    except Exception as error:
        return [f"{path}_target_={node['_target_']}: cannot be imported ({str(error).splitlines()[0]})"]
    arguments = {k: _stand_in(v) if _is_node(v) else _value(cfg, path + k) for k, v in node.items()}
    if broken := [_unresolved(path + k, v) for k, v in arguments.items() if isinstance(v, Exception)]:
        return broken
    if path == "trainer." and arguments.get("precision") == AUTO:
        del arguments["precision"]  # capsexp's own value, resolved before Lightning sees it
    problems = argument_problems(target, {k: v for k, v in arguments.items() if v is not _stand_in}, prefix=path)
    if path == "trainer.":  # Lightning's precisions, and capsexp's own
        problems = [f"{p}, or '{AUTO}'" if p.startswith("trainer.precision=") else p for p in problems]
    if not problems and node.get("_partial_") and inspect.isclass(target) and issubclass(target, torch.optim.Optimizer):
        values = {k: v for k, v in arguments.items() if not k.startswith("_")}
        try:  # torch checks an optimizer's values when it is built (Invalid learning rate: -0.1)
            target([torch.zeros(1, requires_grad=True)], **values)
        except (ValueError, TypeError) as error:
            given = " ".join(f"{k}={shown(v)}" for k, v in values.items())
            problems.append(f"{path.rstrip('.')} ({target.__name__}: {given}): {error}")
    return problems


def _is_node(value: Any) -> bool:
    return isinstance(value, dict) and "_target_" in value


def _stand_in(node: dict) -> Any:
    """What a node built inside another (``model.net.routing``) stands for in its parent's check: an
    uninitialised instance of its class (``model/routing=dynamic`` under an EM model is refused); for a
    partial, this function itself, which leaves the argument unchecked."""
    try:
        built = get_object(node["_target_"])
        return built.__new__(built) if inspect.isclass(built) and not node.get("_partial_") else _stand_in
    except Exception:  # reported as the node's own problem
        return _stand_in


def _unresolved(key: str, error: Exception) -> str:
    if isinstance(error, MissingMandatoryValue):
        return f"{key}: needs a value (the config leaves it ???); set {key}=..."
    cause = error
    while cause is not None and not isinstance(cause, CapsexpError):
        cause = cause.__cause__ or cause.__context__
    if cause is not None:  # a resolver's own message for the user (an image folder that is not there)
        return f"{key}: {cause}"
    return f"{key}: cannot be resolved ({str(error).splitlines()[0]})"


def config_problems(cfg: DictConfig) -> list[str]:
    """One line per key whose value is not allowed: ``key=value: must be ...``."""
    tree = OmegaConf.to_container(cfg, resolve=False)
    job = {key: _value(cfg, key) for key in tree if key in inspect.signature(JobOptions).parameters}
    return argument_problems(JobOptions, job) + _node_problems(cfg, "", tree) + _combination_problems(cfg)


def _count(value: Any) -> int | None:
    """A positive whole number, else None (absent, "auto", -1: the config does not say how many)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _combination_problems(cfg: DictConfig) -> list[str]:
    crop, resize, batch = (_count(_value(cfg, f"data.{key}")) for key in ("crop_size", "resize", "batch_size"))
    problems = (
        [f"data.crop_size={crop}: must be at most data.resize={resize}"] if crop and resize and crop > resize else []
    )
    devices = _value(cfg, "trainer.devices")
    devices = _count(len(devices) if isinstance(devices, list) else devices)  # a list of device indices
    processes = devices and devices * (_count(_value(cfg, "trainer.num_nodes")) or 1)
    if batch and processes and batch % processes:
        problems.append(
            f"data.batch_size={batch}: the global batch must divide by the {processes} processes "
            f"(trainer.devices x trainer.num_nodes); e.g. data.batch_size={processes * max(1, batch // processes)}"
        )
    if _value(cfg, "attack") is not None and _value(cfg, "test") is False:
        problems.append("attack: attacks the tested checkpoint; set test=true (or drop attack)")
    if _value(cfg, "attack") is not None and processes and processes > 1:
        problems.append(f"attack: runs in one process; set trainer.devices=1 (now {processes} processes)")
    if _value(cfg, "train") is False and _value(cfg, "test") is False:
        problems.append("train=false test=false: nothing to do; set train=true, test=true or both")
    return problems


def _merged(problems: list[str]) -> list[str]:
    """Problems that say the same of several keys (one value they all read), said once for all of them."""
    keys: dict[str, list[str]] = {}
    for problem in problems:
        key, _, text = problem.partition(": ")
        keys.setdefault(text, []).append(key)
    return [f"{', '.join(names)}: {text}" for text, names in keys.items()]


def check_config(cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` naming every key whose value is not allowed."""
    if problems := _merged(config_problems(cfg)):
        more = [f"... and {len(problems) - _SHOWN} more"] if len(problems) > _SHOWN else []
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems[:_SHOWN] + more))
