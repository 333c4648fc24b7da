"""The command line: ``python -m capsexp [hydra overrides]`` (also installed as ``capsexp``)."""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import sys
from pathlib import Path

import hydra
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from capsexp import CONFIG_DIR, hydra_setup
from capsexp.errors import CapsexpError, ConfigError
from capsexp.run.resume import expand_run_folder
from capsexp.run.slurm import resume_if_restarted

log = logging.getLogger("capsexp")

# Before Hydra composes (here, and in the processes of a launcher, which import this module; those of
# Hydra's launchers also get the ConfigStore of the process that started them, nets included).
hydra_setup.register_routing()


def report(error: CapsexpError) -> None:
    """Print a user's error as its message alone and exit with its status (2: usage, 1: other).
    HYDRA_FULL_ERROR=1 shows the traceback instead, as for Hydra's own errors."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise error
    print(f"\n{error.prefix}{error}", file=sys.stderr)
    sys.exit(error.exit_code)


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Run one job; return ``cfg.optimized_metric`` for Hydra sweepers (Optuna maximises it)."""
    # Imported here: `--help`, `--cfg job` and the command-line checks answer without importing torch.
    from capsexp.run.config_check import check_config
    from capsexp.run.train import run

    try:
        check_config(cfg)

        return optimized_metric(cfg, run(cfg))
    except CapsexpError as error:
        report(error)


def optimized_metric(cfg: DictConfig, metrics: dict[str, float]) -> float | None:
    """The value of ``cfg.optimized_metric`` for the sweeper. A run that never validated has none: a
    warning, unless a sweeper (Optuna) needs the value, which makes it an error."""
    metric_name = cfg.get("optimized_metric")
    if not metric_name or (metric_name not in metrics and not cfg.get("train")):
        return None  # nothing to optimise in a test-only run (train=false ckpt_path=...)
    if metric_name not in metrics:
        logged = ", ".join(sorted(name for name in metrics if "/" in name)) or "none"
        if any(name.startswith("val/") for name in metrics):
            problem, advice = "is not a metric this run logs", f"choose one of: {logged}"
        else:
            max_steps = cfg.trainer.get("max_steps", -1)
            below = f", below trainer.max_steps={max_steps}" if max_steps and max_steps > 0 else ""
            problem = "was not logged: the run never validated"
            advice = (
                f"validate before the run ends (trainer.val_check_interval=N, a number of steps{below}; "
                f"trainer.limit_val_batches not 0) or optimise a metric it logs (optimized_metric=test/acc)"
            )
        if _sweeper_needs_metric():
            raise CapsexpError(
                f"optimized_metric={metric_name} {problem}, and the sweeper needs its value.\nTo get one, {advice}"
            )
        log.warning(f"optimized_metric={metric_name} {problem} (only a sweeper needs it); to get it, {advice}")
        return None
    log.info(f"{metric_name} = {metrics[metric_name]:.4f}")
    return metrics[metric_name]


def _sweeper_needs_metric() -> bool:
    """True for a multirun driven by a sweeper that optimises (any but Hydra's basic sweeper)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return False
    hydra_cfg = HydraConfig.get()
    target = str(hydra_cfg.sweeper.get("_target_", ""))
    return hydra_cfg.mode == RunMode.MULTIRUN and not target.endswith("BasicSweeper")


def cli() -> None:
    """The entry point: group options checked before Hydra composes (its message lists the search
    path; ours names the option and the choices) and a run folder given as ``ckpt_path`` expanded
    (:mod:`capsexp.run.resume`; a restarted SLURM job's own folder: :mod:`capsexp.run.slurm`), then :func:`main`."""
    try:
        check_group_overrides(sys.argv[1:], CONFIG_DIR)
        sys.argv[1:] = expand_run_folder(resume_if_restarted(sys.argv[1:]))
    except CapsexpError as error:
        report(error)
    hydra_setup.register()  # the nets' nodes: imports torch, after the checks that answer without it
    main()


# ---- checks of the command line, before Hydra runs the job ---------------------------------------
# Groups and keys that moved: the old spelling gets the new one in its error.
RENAMED = {
    "optimizer": "model/optimizer",
    "lr_scheduler": "model/lr_scheduler",
    "margin": "model/margin",
    "optimizer.": "model.optimizer.",
    "lr_scheduler.": "model.lr_scheduler.",
    "callbacks.margin.": "model.margin.",
    "dataset.": "geometry.",
    # The routing options of the capsule nets: one object, model.net.routing.
    "model.net.routing_iterations": "model.net.routing.iterations",
    **{
        f"model.net.{field.name}": f"model.net.routing.{field.name}"
        for options in hydra_setup.ROUTINGS.values()
        for field in dataclasses.fields(options)
    },
}


def check_group_overrides(arguments: list[str], config_dir: Path) -> None:
    """Raise :class:`ConfigError` for ``group=option`` on the command line where the group has no such
    option (sweeps ``model=a,b`` included), for a group or key that was renamed, for a model group the
    chosen model's recipe lacks and for a plain key of a swept optional group; anything else is left to
    Hydra, whose config loader answers what the groups hold and what each config chooses."""
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        model_groups = {}  # model/<group>=<value> overrides
        for argument in arguments:
            key, sep, value = argument.partition("=")
            key = key.lstrip("+~")
            if not sep or argument.startswith("-"):
                continue
            for old, new in RENAMED.items():
                if key == old or (old.endswith(".") and key.startswith(old)):
                    renamed = new + key[len(old) :] if old.endswith(".") else new
                    raise ConfigError(f"{key}={value}: renamed; use {renamed}={value}")
            if key == "model/net":
                hydra_setup.register()
            # Only a group's options, not its subgroups (model/routing is no option of model).
            options = [] if "." in key else loader.get_group_options(key)
            if not options or not value or "(" in value or value == "null":
                continue
            # A sweep a,b or a list [a,b] (several options of one group merged, e.g. callbacks).
            for option in value.removeprefix("[").removesuffix("]").split(","):
                if option not in options:
                    close = difflib.get_close_matches(option, options, n=1)
                    hint = f" (did you mean {key}={close[0]}?)" if close else ""
                    raise ConfigError(f"{key}={option}: no such option{hint}\n  {key} is one of: {', '.join(options)}")
            if key.startswith("model/") and not argument.startswith("+"):
                model_groups[key.removeprefix("model/")] = value
        _check_models_have_groups(model_groups, arguments)
        _check_keys_of_swept_optional_groups(arguments)


def _choices(overrides: list[str]) -> dict[str, str | None]:
    """``{group: option}`` as Hydra composes them with ``overrides`` (``model/margin: linear_run``; an
    optional group left out: None)."""
    hydra_setup.register()  # a model config chooses its net
    return dict(compose("config", overrides=overrides, return_hydra_config=True).hydra.runtime.choices)


def _check_keys_of_swept_optional_groups(arguments: list[str]) -> None:
    """``-m attack=fgsm,bim attack.eps=[0,0.1]``: Hydra applies the plain key to the sweep's base
    config, which has no attack (the group's default is null), and fails with "Key 'attack' is not in
    struct". ``++attack.eps=...`` is applied there and in every job."""

    def is_sweep(value: str) -> bool:  # a,b (a list [a,b] is one value)
        return "," in value and not value.startswith("[")

    if not any(argument in ("-m", "--multirun") for argument in arguments):
        return
    swept = {a.split("=", 1)[0].lstrip("+") for a in arguments if "=" in a and is_sweep(a.split("=", 1)[1])}
    plain_keys = []  # key=value under a swept group, not itself swept
    for argument in arguments:
        key, _, value = argument.partition("=")
        group = key.split(".", 1)[0]
        if "." in key and not key.startswith("+") and group in swept and not is_sweep(value):
            plain_keys.append((argument, key, group))
    if not plain_keys:
        return
    optional = {group for group, option in _choices([]).items() if option is None}  # the default chooses none
    for argument, key, group in plain_keys:
        if group in optional:
            raise ConfigError(
                f"{argument}: in a sweep over {group} options, Hydra sets {key} before it chooses the {group} "
                f"(the default has none); write ++{argument}"
            )


def _check_models_have_groups(model_groups: dict[str, str], arguments: list[str]) -> None:
    """``model/margin=linear`` with a model whose recipe has no margin (LeNet5's cross-entropy, CapsNet's
    margin loss): say so, instead of Hydra's "No match in the defaults list"."""
    if not model_groups or any(a.lstrip("+").startswith(("experiment=", "hparams_search=")) for a in arguments):
        return  # they choose the model themselves: left to Hydra
    chosen = [a.split("=", 1)[1] for a in arguments if a.startswith("model=")]
    for model in chosen[-1].split(",") if chosen else [None]:
        choices = _choices([f"model={model}"] if model else [])
        groups = sorted(name.removeprefix("model/") for name in choices if name.startswith("model/"))
        for group, value in model_groups.items():
            if group not in groups:
                raise ConfigError(
                    f"model/{group}={value}: model={choices['model']} has no {group} in its recipe "
                    f"(it has: {', '.join(groups) or 'none'})"
                    + (
                        "; the margin schedule is for the spread loss of the EM-capsule models"
                        if group == "margin"
                        else ""
                    )
                )


if __name__ == "__main__":
    cli()
