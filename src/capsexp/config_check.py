"""The composed config, checked before anything heavy starts.

Every user-facing key has a rule: the values it allows, in words a user reads in the error. A key
that a config does not have (``data.stereo`` under ``data=mnist``) is not checked. The checks need
neither torch nor Lightning, so a mistake is reported within a second of typing the command.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from capsexp.errors import ConfigError

_ABSENT = object()

# Mirrors of choices defined where torch is imported (tests keep them equal).
COST_NORMALIZATIONS = ("none", "data", "standardize", "layer")
PRECISIONS = (
    "transformer-engine",
    "transformer-engine-float16",
    "16-true",
    "16-mixed",
    "bf16-true",
    "bf16-mixed",
    "32-true",
    "64-true",
    "64",
    "32",
    "16",
    "bf16",
    64,
    32,
    16,
)
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def positive_int(value: Any) -> bool:
    return _is_int(value) and value > 0


def non_negative_int(value: Any) -> bool:
    return _is_int(value) and value >= 0


def positive_number(value: Any) -> bool:
    return _is_number(value) and value > 0


def non_negative_number(value: Any) -> bool:
    return _is_number(value) and value >= 0


def boolean(value: Any) -> bool:
    return isinstance(value, bool)


def one_of(*choices: Any) -> Callable[[Any], bool]:
    return lambda value: any(value == choice and type(value) is type(choice) for choice in choices)


def optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


def number_in(low: float, high: float, *, low_open: bool = False) -> Callable[[Any], bool]:
    return lambda value: _is_number(value) and (low < value if low_open else low <= value) and value <= high


def steps_limit(value: Any) -> bool:
    """Lightning's max_epochs / max_steps: -1 for no limit."""
    return _is_int(value) and (value > 0 or value == -1)


def batches_limit(value: Any) -> bool:
    """Lightning's limit_*_batches: a number of batches, or a fraction of the set."""
    return value is None or non_negative_int(value) or (isinstance(value, float) and 0.0 <= value <= 1.0)


def validation_interval(value: Any) -> bool:
    """Lightning's val_check_interval: a number of training batches, or a fraction of an epoch."""
    return value is None or positive_int(value) or (isinstance(value, float) and 0.0 < value <= 1.0)


def devices(value: Any) -> bool:
    if isinstance(value, (list, tuple, ListConfig)):
        return len(value) > 0 and all(non_negative_int(index) for index in value)
    return (
        value == "auto"
        or (_is_int(value) and (value > 0 or value == -1))
        or (isinstance(value, str) and value.replace(",", "").strip().isdigit())
    )


def number_list(value: Any) -> bool:
    return isinstance(value, (list, tuple, ListConfig)) and len(value) > 0 and all(_is_number(v) for v in value)


def number_range(value: Any) -> bool:
    return (
        isinstance(value, (list, tuple, ListConfig))
        and len(value) == 2
        and all(positive_number(v) for v in value)
        and value[0] <= value[1]
    )


def factor_map(value: Any) -> bool:
    return value is None or (isinstance(value, dict) and all(positive_number(v) for v in value.values()))


def non_empty_string(value: Any) -> bool:
    return isinstance(value, str) and value.strip() != ""


@dataclass(frozen=True)
class Rule:
    key: str
    check: Callable[[Any], bool]
    allowed: str


# Layer sizes of the capsule nets (models.CapsNet, models.MatrixCapsNet): positive integers.
CAPSNET_SIZES = ("conv_channels", "primary_types", "primary_dim", "pose_dim")
EM_CAPS_SIZES = ("conv_caps1_types", "conv_caps2_types", "kernel_size", "pose_size")

RULES: tuple[Rule, ...] = (
    # Top level
    Rule("seed", optional(_is_int), "an integer, or null for no seeding"),
    Rule("train", boolean, "true or false"),
    Rule("test", boolean, "true or false"),
    Rule("ckpt_path", optional(non_empty_string), "the path of a checkpoint file, or null"),
    Rule("task_name", non_empty_string, "a non-empty name (the folder under the log dir)"),
    Rule("optimized_metric", optional(non_empty_string), "a logged metric name, e.g. val/acc_best, or null"),
    Rule("float32_matmul_precision", one_of("highest", "high", "medium"), "highest, high (TF32 on GPUs) or medium"),
    # Data
    Rule("data.batch_size", positive_int, "a positive integer (the global batch, split over the processes)"),
    Rule("data.val_size", positive_int, "a positive integer (training images held out for validation)"),
    Rule("data.split_seed", _is_int, "an integer"),
    Rule("data.num_workers", non_negative_int, "0 or a positive integer (DataLoader worker processes)"),
    Rule("data.pin_memory", boolean, "true or false"),
    Rule("data.on_device", one_of("auto", True, False), "auto, true or false"),
    Rule("data.download", boolean, "true or false"),
    Rule("data.verify_checksums", boolean, "true or false"),
    Rule("data.normalize", boolean, "true or false"),
    Rule("data.train_shift", non_negative_int, "0 or a positive number of pixels"),
    Rule("data.test_rotations", optional(number_list), "null or a non-empty list of angles in degrees, e.g. [0,45,90]"),
    Rule("data.stereo", one_of("both", "left", "split"), "both, left or split"),
    Rule("data.viewpoint", one_of(None, "azimuth", "elevation"), "null, azimuth or elevation"),
    Rule("data.familiar", boolean, "true or false"),
    Rule("data.resize", positive_int, "a positive number of pixels"),
    Rule("data.crop_size", positive_int, "a positive number of pixels, at most data.resize"),
    Rule("data.brightness", non_negative_number, "a number >= 0 (brightness offset range)"),
    Rule("data.contrast", number_range, "[low, high] with 0 < low <= high, e.g. [0.2,1.8]"),
    Rule("data.base_url", non_empty_string, "a URL"),
    # Models
    Rule("model.net.routing_iterations", positive_int, "a positive integer (1: no routing by agreement, no E-step)"),
    Rule("model.net.final_lambda", positive_number, "a number > 0 (inverse temperature at the last iteration)"),
    Rule("model.net.sigma_eps", positive_number, "a number > 0 (added to every variance)"),
    Rule("model.net.cost_normalization", one_of(*COST_NORMALIZATIONS), ", ".join(COST_NORMALIZATIONS)),
    Rule("model.net.route_per_window", boolean, "true or false"),
    Rule("model.net.learn_inverse_temperature", boolean, "true or false"),
    Rule("model.net.conv1_norm", boolean, "true or false"),
    Rule("model.net.coordinate_addition", boolean, "true or false"),
    Rule("model.net.weight_std", optional(positive_number), "null or a number > 0"),
    *(Rule(f"model.net.{key}", positive_int, "a positive integer") for key in CAPSNET_SIZES + EM_CAPS_SIZES),
    Rule("model.net.reconstruction", boolean, "true or false"),
    Rule("model.compile", boolean, "true or false"),
    Rule("model.net.detach_agreement", boolean, "true or false"),
    Rule("model.objective.margin", number_in(0.0, 1.0, low_open=True), "a number in (0, 1]"),
    Rule("model.objective.m_pos", number_in(0.0, 1.0), "a number in [0, 1]"),
    Rule("model.objective.m_neg", number_in(0.0, 1.0), "a number in [0, 1]"),
    Rule("model.objective.lambda_", non_negative_number, "a number >= 0"),
    Rule("model.objective.recon_weight", non_negative_number, "a number >= 0 (0 disables the reconstruction term)"),
    # Optimisation
    Rule("model.optimizer.lr", positive_number, "a number > 0"),
    Rule("model.lr_multipliers", factor_map, "null or {parameter name: a number > 0}"),
    Rule("model.optimizer.weight_decay", non_negative_number, "a number >= 0"),
    Rule("model.optimizer.momentum", number_in(0.0, 1.0), "a number in [0, 1]"),
    Rule("model.lr_scheduler.scheduler.decay_rate", number_in(0.0, 1.0, low_open=True), "a number in (0, 1]"),
    Rule("model.lr_scheduler.scheduler.decay_steps", positive_number, "a number > 0"),
    Rule("model.margin.start", number_in(0.0, 1.0), "a number in [0, 1]"),
    Rule("model.margin.end", number_in(0.0, 1.0), "a number in [0, 1]"),
    Rule("model.margin.duration", positive_number, "a number > 0"),
    Rule("model.margin.unit", one_of("epoch", "step"), "epoch or step"),
    Rule("callbacks.routing_diagnostics.every_n_steps", positive_int, "a positive integer"),
    Rule("callbacks.routing_diagnostics.histograms", boolean, "true or false"),
    Rule("callbacks.progress_log.interval_s", positive_number, "a number of seconds > 0"),
    Rule("callbacks.progress_log.when", one_of("auto", "always", "never"), "auto, always or never"),
    # Trainer
    Rule("trainer.max_epochs", optional(steps_limit), "a positive integer, or -1 for no limit"),
    Rule("trainer.min_epochs", optional(non_negative_int), "0 or a positive integer"),
    Rule("trainer.max_steps", steps_limit, "a positive integer, or -1 for no limit"),
    Rule(
        "trainer.limit_train_batches", batches_limit, "null, a number of batches (integer >= 0) or a fraction in [0, 1]"
    ),
    Rule(
        "trainer.limit_val_batches", batches_limit, "null, a number of batches (integer >= 0) or a fraction in [0, 1]"
    ),
    Rule(
        "trainer.limit_test_batches", batches_limit, "null, a number of batches (integer >= 0) or a fraction in [0, 1]"
    ),
    Rule(
        "trainer.val_check_interval",
        validation_interval,
        "a number of training batches (integer > 0) or a fraction of an epoch in (0, 1]",
    ),
    Rule("trainer.check_val_every_n_epoch", optional(positive_int), "a positive integer, or null"),
    Rule("trainer.log_every_n_steps", positive_int, "a positive integer"),
    Rule("trainer.accelerator", one_of(*ACCELERATORS), ", ".join(ACCELERATORS)),
    Rule("trainer.devices", devices, "a positive number of devices, -1 or auto for all, or a list of device indices"),
    Rule("trainer.num_nodes", positive_int, "a positive integer"),
    Rule("trainer.precision", one_of(*PRECISIONS), "32-true, bf16-mixed, 16-mixed, bf16-true, 16-true or 64-true"),
    Rule("trainer.deterministic", one_of(True, False, "warn"), "true, false or warn"),
)


class _Unresolvable:
    def __init__(self, error: Exception) -> None:
        self.error = error


def _value(cfg: DictConfig, key: str) -> Any:
    """The resolved value at ``key``, ``_ABSENT``, or :class:`_Unresolvable`; lists as plain lists."""
    try:
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if isinstance(value, (DictConfig, ListConfig)):
            return OmegaConf.to_container(value, resolve=True)
    except Exception as error:  # a broken interpolation: reported with the key, not as a traceback
        return _Unresolvable(error)
    return value


def _shown(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, list):
        return "[" + ",".join(_shown(v) for v in value) + "]"
    return str(value)


def config_problems(cfg: DictConfig) -> list[str]:
    """One line per key whose value is not allowed: ``key=value: allowed``."""
    problems = []
    for rule in RULES:
        value = _value(cfg, rule.key)
        if value is _ABSENT:
            continue
        if isinstance(value, _Unresolvable):
            problems.append(f"{rule.key}: cannot be resolved ({str(value.error).splitlines()[0]})")
        elif not rule.check(value):
            problems.append(f"{rule.key}={_shown(value)}: must be {rule.allowed}")
    problems.extend(_combination_problems(cfg))
    return problems


def _combination_problems(cfg: DictConfig) -> list[str]:
    problems = []
    crop, resize = _value(cfg, "data.crop_size"), _value(cfg, "data.resize")
    if positive_int(crop) and positive_int(resize) and crop > resize:
        problems.append(f"data.crop_size={crop}: must be at most data.resize={resize}")
    batch, processes = _value(cfg, "data.batch_size"), _process_count(cfg)
    if positive_int(batch) and processes and batch % processes:
        problems.append(
            f"data.batch_size={batch}: the global batch must divide by the {processes} processes "
            f"(trainer.devices x trainer.num_nodes); e.g. data.batch_size={processes * max(1, batch // processes)}"
        )
    if _value(cfg, "train") is False and _value(cfg, "test") is False:
        problems.append("train=false test=false: nothing to do; set train=true, test=true or both")
    return problems


def _process_count(cfg: DictConfig) -> int | None:
    """Processes of the run where the config says so without asking the hardware."""
    count = _value(cfg, "trainer.devices")
    nodes = _value(cfg, "trainer.num_nodes")
    if isinstance(count, list):
        count = len(count)
    if not positive_int(count) or not positive_int(nodes if nodes is not _ABSENT else 1):
        return None
    return count * (nodes if nodes is not _ABSENT else 1)


def check_config(cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` naming every key whose value is not allowed."""
    problems = config_problems(cfg)
    if problems:
        shown = problems[:8] + ([f"... and {len(problems) - 8} more"] if len(problems) > 8 else [])
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(shown))


# Groups and keys that moved: the old spelling gets the new one in its error.
RENAMED = {
    "optimizer": "model/optimizer",
    "lr_scheduler": "model/lr_scheduler",
    "margin": "model/margin",
    "optimizer.": "model.optimizer.",
    "lr_scheduler.": "model.lr_scheduler.",
    "callbacks.margin.": "model.margin.",
    "dataset.": "geometry.",
    "model.net.iterations": "model.net.routing_iterations",
}


def check_group_overrides(arguments: list[str], config_dir: Path) -> None:
    """Raise :class:`ConfigError` for ``group=option`` on the command line where ``conf/<group>/``
    has no such option (sweeps ``model=a,b`` included), and for a group or key that was renamed;
    anything else is left to Hydra."""
    for argument in arguments:
        key, sep, value = argument.partition("=")
        key = key.lstrip("+~")
        if not sep or argument.startswith("-") or key.split("/")[0] == "hydra":
            continue
        for old, new in RENAMED.items():
            if key == old or (old.endswith(".") and key.startswith(old)):
                renamed = new + key[len(old) :] if old.endswith(".") else new
                raise ConfigError(f"{key}={value}: renamed; use {renamed}={value}")
        if not all(part.isidentifier() for part in key.split("/")):
            continue
        folder = config_dir / key
        if not folder.is_dir() or not value or "(" in value or value == "null":
            continue
        options = sorted(path.stem for path in folder.glob("*.yaml"))
        for option in value.split(","):
            if option not in options:
                close = difflib.get_close_matches(option, options, n=1)
                hint = f" (did you mean {key}={close[0]}?)" if close else ""
                raise ConfigError(f"{key}={option}: no such option{hint}\n  {key} is one of: {', '.join(options)}")
        if key.startswith("model/") and not argument.startswith("+"):
            _check_model_has_group(key.removeprefix("model/"), value, arguments, config_dir)


def _check_model_has_group(group: str, value: str, arguments: list[str], config_dir: Path) -> None:
    """``model/margin=linear`` with a model whose recipe has no margin (LeNet5's cross-entropy, CapsNet's
    margin loss): say so, instead of Hydra's "No match in the defaults list"."""
    if any(a.lstrip("+").startswith(("experiment=", "hparams_search=")) for a in arguments):
        return  # they choose the model themselves: left to Hydra
    chosen = [a.split("=", 1)[1] for a in arguments if a.startswith("model=")]
    models = chosen[-1].split(",") if chosen else [_default_model(config_dir)]
    for model in models:
        groups = _model_config_groups(config_dir, model)
        if group not in groups:
            raise ConfigError(
                f"model/{group}={value}: model={model} has no {group} in its recipe "
                f"(it has: {', '.join(sorted(groups)) or 'none'})"
                + ("; the margin schedule is for the spread loss of the EM-capsule models" if group == "margin" else "")
            )


def _default_model(config_dir: Path) -> str:
    for entry in _yaml_defaults(config_dir / "config.yaml"):
        if isinstance(entry, dict) and "model" in entry:
            return str(entry["model"])
    return "lenet5"


def _model_config_groups(config_dir: Path, model: str) -> set[str]:
    """The nested groups (optimizer, lr_scheduler, margin) a model config lists, its bases' included."""
    path = config_dir / "model" / f"{model}.yaml"
    groups: set[str] = set()
    for entry in _yaml_defaults(path) if path.exists() else []:
        if isinstance(entry, str) and entry != "_self_":
            groups |= _model_config_groups(config_dir, entry)
        elif isinstance(entry, dict):
            groups |= {name.removeprefix("override ").strip() for name in entry}
    return groups


def _yaml_defaults(path: Path) -> list:
    import yaml

    return (yaml.safe_load(path.read_text()) or {}).get("defaults", [])
