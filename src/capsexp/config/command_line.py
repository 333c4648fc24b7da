"""The command line checked before Hydra composes: a group option that does not exist (with "did you
mean"), a renamed group or key, a model group the chosen model's recipe lacks, a plain key of a swept
optional group. Hydra's own messages for these list its search path or fail deep in composition; these
name the option and what is allowed, in a fraction of a second (no torch imported unless a net's
config is needed)."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import io
import sys
from collections.abc import Callable
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from capsexp.config import hydra_setup
from capsexp.errors import ConfigError
from capsexp.locations import experiment_config, experiment_files, quote_locations
from capsexp.overrides import is_override, is_sweep, left_side, of_key, prefix, values_of, with_value, written
from capsexp.overrides import key as override_key

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
            if not is_override(argument) or written(argument) is None:
                continue
            key, value = override_key(argument), written(argument)
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
            if key.startswith("model/") and not prefix(argument):
                model_groups[key.removeprefix("model/")] = value
        _check_models_have_groups(model_groups, arguments)
        _check_keys_of_swept_optional_groups(arguments)
        _check_keys(arguments, loader, config_dir)
        _check_required_groups(arguments, loader)
    check_study_budget(arguments, config_dir)


def _values(arguments: list[str], key: str) -> list[str]:
    """The values the last ``key=...`` argument gives (a sweep ``a,b`` gives both); none without one."""
    given = values_of(arguments, key)
    return given[-1].split(",") if given else []


def _check_required_groups(arguments: list[str], loader) -> None:
    """An experiment config's ``requires`` (``[routing]``: the groups it needs chosen, ``+routing=<name>``)
    given on the command line; else it would fail deep in Hydra on an interpolation."""
    files = experiment_files()
    for experiment in _values(arguments, "experiment"):
        path = files.get(experiment)
        for group in (experiment_config(path).get("requires") or []) if path else []:
            chosen = _values(arguments, group)
            if len(chosen) != 1:
                options = ", ".join(loader.get_group_options(group))
                given = f" (given {','.join(chosen)}: run the study once for each)" if chosen else ""
                raise ConfigError(
                    f"experiment={experiment} judges one {group}{given}: add +{group}=<name>, one of: {options}"
                )


def check_study_budget(arguments: list[str], config_dir: Path) -> None:
    """``study=<budget>`` chooses one of the ``budgets`` of the experiment config: a budget it lacks, or
    a study without an experiment, would otherwise fail deep in Hydra on an interpolation."""
    budgets = _values(arguments, "study")
    if not budgets:
        return
    experiments = _values(arguments, "experiment")
    files = {**experiment_files(), **{path.stem: path for path in (config_dir / "experiment").glob("*.yaml")}}
    with_budgets = sorted(name for name, path in files.items() if "budgets" in experiment_config(path))
    if not experiments:
        raise ConfigError(
            f"study={','.join(budgets)} chooses the budget of an experiment config: add experiment=<name>, "
            f"one of: {', '.join(with_budgets)}"
        )
    for experiment in experiments:
        path = files.get(experiment)
        allowed = list(experiment_config(path).get("budgets") or {}) if path else []
        for budget in budgets:
            if budget not in allowed:
                has = f"its budgets are: {', '.join(allowed)}" if allowed else "it has no budgets"
                raise ConfigError(
                    f"study={budget}: experiment={experiment} has no such budget ({has}); "
                    f"experiments with budgets: {', '.join(with_budgets)}"
                )


@contextlib.contextmanager
def _nets(needed: bool):
    """The ``model/net`` options a model config chooses, for composing a config to check: their nodes as
    registered, where they are; else, for the while, nodes of their keys alone read from the nets' source
    where ``needed`` (a key under ``model.net`` is checked: :func:`capsexp.config.hydra_setup.store_net_keys`),
    or empty ones of the same names. The nets' real nodes come from their constructors' signatures, which
    import torch (seconds): a mistyped key is answered without it."""
    options = ConfigStore.instance().repo.get("model", {}).get("net", {})
    names = [target.rpartition(".")[2] for target in hydra_setup.NETS]
    if all(f"{name}.yaml" in options for name in names):
        yield
        return
    previous = dict(options)
    if needed:
        hydra_setup.store_net_keys()
    else:
        for name in names:
            ConfigStore.instance().store(group="model/net", name=name, node={}, package="model.net")
    try:
        yield
    finally:  # as they were: whatever composes next registers the nets' own nodes
        if previous:
            ConfigStore.instance().repo["model"]["net"] = previous
        else:
            ConfigStore.instance().repo["model"].pop("net")


def _choices(overrides: list[str]) -> dict[str, str | None]:
    """``{group: option}`` as Hydra composes them with ``overrides`` (``model/margin: linear_run``; an
    optional group left out: None), inside :func:`check_group_overrides`'s Hydra context."""
    search_path = str(GlobalHydra.instance().config_loader().get_sources())
    return dict(_composed_choices(search_path, tuple(overrides)))


@functools.lru_cache(maxsize=32)
def _composed_choices(search_path: str, overrides: tuple[str, ...]) -> tuple[tuple[str, str | None], ...]:
    """Kept per process (a composition takes most of a second; every run of a model group asks once):
    which options a composition chooses depends on the config files of ``search_path`` alone."""
    with _nets(needed=False):
        config = compose("config", overrides=list(overrides), return_hydra_config=True)
    return tuple(config.hydra.runtime.choices.items())


def _check_keys_of_swept_optional_groups(arguments: list[str]) -> None:
    """``-m attack=fgsm,bim attack.eps=[0,0.1]``: Hydra applies the plain key to the sweep's base
    config, which has no attack (the group's default is null), and fails with "Key 'attack' is not in
    struct". ``++attack.eps=...`` is applied there and in every job."""

    if not any(argument in ("-m", "--multirun") for argument in arguments):
        return
    given = [a for a in arguments if is_override(a) and written(a) is not None]
    swept = {override_key(a) for a in given if is_sweep(a)}
    plain_keys = []  # key=value under a swept group, not itself swept
    for argument in given:
        key = override_key(argument)
        group = key.split(".", 1)[0]
        if "." in key and not prefix(argument) and group in swept and not is_sweep(argument):
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


@functools.lru_cache(maxsize=32)
def _composed(config_dir: str, choices: tuple[str, ...], nets: bool) -> DictConfig | None:
    """The config the group ``choices`` compose from ``config_dir`` (inside :func:`check_group_overrides`'s
    Hydra context), kept per process: which keys exist depends on the choices alone, those under
    ``model.net`` on the nets' own nodes, composed with them where ``nets`` (:func:`_nets`)."""
    with _nets(needed=nets):
        try:
            return compose("config", overrides=list(choices), return_hydra_config=True)
        except Exception:
            return None


def _first(value: str) -> str:
    """A sweep's first value (``a,b`` -> ``a``; a list ``[a,b]`` is one value)."""
    return value if value.startswith("[") else value.split(",", 1)[0]


def _check_keys(arguments: list[str], loader, config_dir: Path) -> None:
    """``trainer.max_epoch=1``, ``data.root=photos`` with data=mnist, ``modle=lenet5``: a key the composed
    config does not have. Hydra's answer is "not in struct" and the advice to add it with ``+``, a key
    nothing would read; this names the key, the closest keys of its node and, for a config group's node,
    the group's options. Composed with the command line's group choices (a sweep's first value)."""
    groups = set(loader.list_groups(""))

    # Set, not added (+) nor deleted (~): a key the config must already have.
    setting = [a for a in arguments if is_override(a) and written(a) is not None and not prefix(a)]

    def is_key(argument: str) -> bool:  # a key=value to check: dotted, or top-level and no config group
        key = override_key(argument)
        if key.startswith("hydra."):
            return False
        return "." in key or ("/" not in key and key not in groups and not loader.get_group_options(key))

    keys = [a for a in setting if is_key(a)]
    if not keys:
        return
    choices = [
        with_value(a, _first(written(a)))
        for a in arguments
        if is_override(a) and written(a) is not None and prefix(a) != "~" and "." not in override_key(a)
        and a not in keys
    ]  # fmt: skip
    # model.net.routing is model/routing's, which composes without the nets' nodes
    nets = any(k.startswith("model.net.") and k.split(".")[2] != "routing" for k in map(override_key, keys))
    config = _composed(str(config_dir), tuple(choices), nets)
    if config is None:  # what does not compose is Hydra's to report, with its own message
        return
    for argument in keys:
        key = override_key(argument)
        parts = key.split(".")
        node, depth = config, 0
        # keys(), not `in`: a key left ??? (a value still to give) is there, and `in` says it is not.
        while depth < len(parts) and OmegaConf.is_dict(node) and parts[depth] in list(node.keys()):
            node, depth = node._get_node(parts[depth]), depth + 1
        if depth == len(parts):
            continue  # the key exists
        parent, group = ".".join(parts[:depth]), "/".join(parts[:depth])
        missing_group = "/".join(parts[: depth + 1])
        unchosen = loader.get_group_options(missing_group)
        if unchosen or (depth and not OmegaConf.is_dict(node)):  # an optional group left unchosen (attack)
            missing_group = missing_group if unchosen else group
            choices_text = "|".join(unchosen or loader.get_group_options(group))
            raise ConfigError(
                f"{argument}: no {missing_group} is chosen, so it has no key {key.split('.', depth + 1)[-1]}"
                + (f"; choose one first: {missing_group}=<{choices_text}>" if choices_text else "")
            )
        present = [str(k) for k in node if not (depth == 0 and k == "hydra")]
        close = difflib.get_close_matches(parts[depth], present, n=1)
        message = f"{argument}: no such key"
        if close:
            meant = ".".join([*parts[:depth], close[0]])
            meant += f"={argument.split('=', 1)[1]}" if meant in groups else ""  # model=lenet5, for modle=lenet5
            message += f" (did you mean {meant}?)"
        message += f"\n  {parent or 'the config'} has: {', '.join(present)}"
        options = loader.get_group_options(group) if depth else []
        if options and not close:  # the key may be another option's: data.root is data=image_folder's
            chosen = OmegaConf.select(config, f"hydra.runtime.choices.{group}", default="...")
            others = ", ".join(o for o in options if o != chosen)
            message += f"\n  {parent} is {group}={chosen}; the other options of {group}: {others}"
        raise ConfigError(message)


def _check_models_have_groups(model_groups: dict[str, str], arguments: list[str]) -> None:
    """``model/margin=linear`` with a model whose recipe has no margin (LeNet5's cross-entropy, CapsNet's
    margin loss): say so, instead of Hydra's "No match in the defaults list"."""
    if not model_groups or of_key(arguments, "experiment") or of_key(arguments, "hparams_search"):
        return  # they choose the model themselves: left to Hydra
    chosen = [written(a) for a in arguments if is_override(a) and left_side(a) == "model"]
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


def list_sweep_jobs(arguments: list[str], config_dir: Path) -> bool:
    """``-m ... --cfg job`` (or ``--cfg hydra|all``): print the jobs the sweep would run, without running
    them, and return True; False for any other command line. Hydra itself refuses ``--cfg`` with ``-m``
    (a traceback), and a sweep's config is one per job. The jobs are those of Hydra's basic sweeper: the
    experiment's ``hydra.sweeper.params``, then the command line's, a key given in both taking the command
    line's values (``+arm/routing=a,b`` replaces a study's arms), every combination of them."""
    from hydra._internal.utils import get_args_parser

    try:  # overrides after --cfg job too, as a user adds them
        with contextlib.redirect_stderr(io.StringIO()):
            given = get_args_parser().parse_intermixed_args(arguments)
    except SystemExit:  # not a command line Hydra takes: Hydra's to answer
        return False
    if not (given.multirun and given.cfg):
        return False
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    hydra_setup.register()  # a model config chooses its net
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        config = loader.load_configuration("config", given.overrides, run_mode=RunMode.MULTIRUN)
        sweeper = config.hydra.sweeper
        if not str(sweeper.get("_target_", "")).endswith(("BasicSweeper", ".ResumableSweeper")):
            raise ConfigError(
                f"-m with --cfg: the sweeper {sweeper._target_} chooses its jobs as it runs, so there is no list "
                "of them before; --cfg job without -m prints the config of the search's base job"
            )
        params = {str(key): str(value) for key, value in (sweeper.get("params") or {}).items()}
        command_line = [str(override) for override in config.hydra.overrides.task]
        parser = OverridesParser.create(config_loader=loader)
        jobs = BasicSweeper.split_arguments(
            parser.parse_overrides([*(f"{k}={v}" for k, v in params.items()), *command_line]), None
        )[0]
    print(_jobs_listing(jobs, params, parser.parse_overrides(command_line)))
    return True


def _jobs_listing(jobs: list[list[str]], params: dict[str, str], command_line) -> str:
    """The jobs as a few lines: what every job sets, each swept key's values (and where they come from),
    then one line per job of the swept keys' values, and the command that prints one job's config."""
    values: dict[str, list[str]] = {}
    for job in jobs:
        for override in job:
            key, value = left_side(override), written(override)
            if value not in values.setdefault(key, []):
                values[key].append(value)
    swept = [key for key, options in values.items() if len(options) > 1]
    given = {override.get_key_element() for override in command_line}
    lines = [f"The sweep's {len(jobs)} job{'s' * (len(jobs) != 1)} (not run):"]
    every = [f"{key}={options[0]}" for key, options in values.items() if key not in swept]
    lines.append(f"  every job: {' '.join(every) or 'no other setting'}")
    for key in swept:
        if key in given and key in params:
            source = f"the command line's, in place of the experiment's {params[key]}"
        else:
            source = "the command line's" if key in given else "the experiment's hydra.sweeper.params"
        lines.append(f"  {key}: {', '.join(values[key])} ({source})")
    for number, job in enumerate(jobs):
        lines.append(f"  #{number}  " + " ".join(o for o in job if left_side(o) in swept))
    lines.append(f"One job's config: python -m capsexp {' '.join(jobs[0])} --cfg job (without -m)")
    return "\n".join(lines)


def options_help(config_file: Path) -> str:
    """``--help`` of a command with a config of its own (``capsexp.predict``, ``capsexp.export``): its config
    file, whose heading says the usage and whose comments describe the options, the one place they are
    described (the defaults list, Hydra's, left out)."""
    lines = config_file.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line and not line.startswith(("#", " ", "-", "defaults"))), 0)
    heading = [line for line in lines[:start] if line.startswith("#")]
    return "\n".join([*heading, "", "Options (key=value; defaults shown):", *lines[start:]]) + "\n"


def command(main: Callable[[], None], config_file: Path) -> None:
    """Run a command with a config of its own (``capsexp.predict``, ``capsexp.export``) from ``sys.argv``:
    ``--help`` prints :func:`options_help`; otherwise a location typed as capsexp printed it (a run folder
    named by its overrides, with ``=`` and ``,``) is quoted for Hydra (:mod:`capsexp.locations`), then
    ``main``, the command's Hydra main, runs."""
    if any(argument in ("--help", "-h") for argument in sys.argv[1:]):
        print(options_help(config_file), end="")
        return
    sys.argv[1:] = quote_locations(sys.argv[1:])
    main()
