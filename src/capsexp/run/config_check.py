"""The composed config, checked before anything is built or any data is read.

What a key allows is declared where it is used: each node with a ``_target_`` is checked against the
type hints of what it builds (:mod:`capsexp.arguments`; Lightning's Trainer has its own, e.g. the
precisions), a torch optimizer by torch itself, built on one parameter, and the top-level keys
against :class:`capsexp.run.train.JobOptions`. Only the rules that tie several keys together are here.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import torch
from hydra.utils import get_object
from omegaconf import DictConfig, ListConfig, MissingMandatoryValue, OmegaConf

from capsexp.arguments import PositiveInt, argument_problems, shown, value_problem
from capsexp.errors import ConfigError

_ABSENT = object()
_SHOWN = 8  # problems listed; the rest are counted


def _value(cfg: DictConfig, key: str) -> Any:
    """The resolved value at ``key`` (containers as plain ones), ``_ABSENT``, or the exception that a
    broken interpolation raised."""
    try:
        value = OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=True)
        return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value
    except Exception as error:
        return error


def _target_nodes(node: dict, path: str = "") -> Iterator[tuple[str, dict]]:
    """``(dotted path with its final dot, node)`` of every node holding a ``_target_``."""
    if "_target_" in node:
        yield path, node
    for key, child in node.items():
        if isinstance(child, dict):
            yield from _target_nodes(child, f"{path}{key}.")


def _node_problems(cfg: DictConfig, path: str, node: dict) -> list[str]:
    try:
        target = get_object(_value(cfg, f"{path}_target_"))
    except Exception as error:
        return [f"{path}_target_={node['_target_']}: cannot be imported ({str(error).splitlines()[0]})"]
    arguments = {k: _built(v) if _is_node(v) else _value(cfg, path + k) for k, v in node.items()}
    broken = [_unresolved(path + k, v) for k, v in arguments.items() if isinstance(v, Exception)]
    arguments = {k: v for k, v in arguments.items() if v is not _ABSENT}
    problems = broken or argument_problems(target, arguments, prefix=path)
    if not problems and arguments.get("_partial_") and _is_optimizer(target):
        values = {k: v for k, v in arguments.items() if not k.startswith("_")}
        try:  # torch checks an optimizer's values when it is built (Invalid learning rate: -0.1)
            target([torch.zeros(1, requires_grad=True)], **values)
        except (ValueError, TypeError) as error:
            given = " ".join(f"{k}={shown(v)}" for k, v in values.items())
            problems.append(f"{path.rstrip('.')} ({target.__name__}: {given}): {error}")
    return problems


def _unresolved(key: str, error: Exception) -> str:
    if isinstance(error, MissingMandatoryValue):
        return f"{key}: needs a value (the config leaves it ???); set {key}=..."
    return f"{key}: cannot be resolved ({str(error).splitlines()[0]})"


def _is_node(value: Any) -> bool:
    return isinstance(value, dict) and "_target_" in value


def _built(node: dict) -> Any:
    """What a node that is built itself (``model.net.routing``) stands for in its parent's check: an
    uninitialised instance of its class, for the parent's hint to test (``model/routing=dynamic``
    under an EM model). Its own arguments are checked as its own node's; a partial is not checked here."""
    try:
        built = get_object(node["_target_"])
        return built.__new__(built) if inspect.isclass(built) and not node.get("_partial_") else _ABSENT
    except Exception:  # reported as the node's own problem
        return _ABSENT


def _is_optimizer(target: Any) -> bool:
    return inspect.isclass(target) and issubclass(target, torch.optim.Optimizer)


def config_problems(cfg: DictConfig) -> list[str]:
    """One line per key whose value is not allowed: ``key=value: must be ...``."""
    from capsexp.run.train import JobOptions  # imports torch and Lightning, as the targets do

    tree = OmegaConf.to_container(cfg, resolve=False)
    job_keys = inspect.signature(JobOptions).parameters
    problems = argument_problems(JobOptions, {key: _value(cfg, key) for key in tree if key in job_keys})
    for path, node in _target_nodes(tree):
        problems += _node_problems(cfg, path, node)
    return problems + _combination_problems(cfg)


def _combination_problems(cfg: DictConfig) -> list[str]:
    problems = []
    crop, resize = _value(cfg, "data.crop_size"), _value(cfg, "data.resize")
    if _positive_int(crop) and _positive_int(resize) and crop > resize:
        problems.append(f"data.crop_size={crop}: must be at most data.resize={resize}")
    batch, devices, nodes = (_value(cfg, key) for key in ("data.batch_size", "trainer.devices", "trainer.num_nodes"))
    # The run's processes where the config says so without asking the hardware (not "auto" or -1).
    devices, nodes = len(devices) if isinstance(devices, list) else devices, 1 if nodes is _ABSENT else nodes
    if all(_positive_int(v) for v in (batch, devices, nodes)) and batch % (devices * nodes):
        processes = devices * nodes
        problems.append(
            f"data.batch_size={batch}: the global batch must divide by the {processes} processes "
            f"(trainer.devices x trainer.num_nodes); e.g. data.batch_size={processes * max(1, batch // processes)}"
        )
    if _value(cfg, "attack") not in (None, _ABSENT):
        if _value(cfg, "test") is False:
            problems.append("attack: attacks the tested checkpoint; set test=true (or drop attack)")
        if all(_positive_int(v) for v in (devices, nodes)) and devices * nodes > 1:
            problems.append(f"attack: runs in one process; set trainer.devices=1 (now {devices * nodes} processes)")
    if _value(cfg, "train") is False and _value(cfg, "test") is False:
        problems.append("train=false test=false: nothing to do; set train=true, test=true or both")
    return problems


def _positive_int(value: Any) -> bool:
    return value_problem(PositiveInt, value) is None


def check_config(cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` naming every key whose value is not allowed."""
    problems = config_problems(cfg)
    if problems:
        more = [f"... and {len(problems) - _SHOWN} more"] if len(problems) > _SHOWN else []
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems[:_SHOWN] + more))
