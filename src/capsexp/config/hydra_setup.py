"""What Hydra needs from capsexp to compose ``conf/``: the resolvers its YAML calls and the config
nodes kept in Hydra's ConfigStore. The command line registers them before Hydra composes; code that
composes the configs itself (tests, notebooks, benchmarks) calls :func:`compose`, or :func:`register`
before ``hydra.compose`` or before resolving a run's saved ``.hydra/config.yaml``.

Kept out of the package root so that importing ``capsexp.nn`` or ``capsexp.models`` loads neither
Hydra nor OmegaConf."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import get_object
from omegaconf import MISSING, DictConfig, OmegaConf

from capsexp.config.image_folder_classes import number_of_classes
from capsexp.config.precision import BF16, FLOAT32, bf16_native
from capsexp.config.routing_options import Routing
from capsexp.config.routing_registry import registered
from capsexp.config.run_names import job_name, run_name
from capsexp.config.verdict_arms import own_cell_nodes, reference_cells, verdict_arms
from capsexp.locations import CONFIG_DIR, quote_locations, working_root

# model/routing=<name>: how the capsule layers route (model.net.routing): every registered routing,
# capsexp's own and installed packages' (capsexp.config.routing_registry).
ROUTINGS = registered()
# model/net=<class name>: the nets a model config builds (model.net), each node made from its
# constructor's signature. A model config chooses one and sets only what differs from its defaults.
NETS = ("capsexp.models.LeNet5", "capsexp.models.BaselineCNN", "capsexp.models.CapsNet", "capsexp.models.MatrixCapsNet")


def smallnorb_channels(stereo: str) -> int:
    """``${stereo_channels:${data.stereo}}``: smallNORB's input channels for its stereo mode."""
    return 2 if stereo == "both" else 1


def bf16_if_native() -> str:
    """``${bf16_if_native:}``: ``bf16-mixed`` where bf16 arithmetic is native on this machine
    (:func:`capsexp.config.precision.bf16_native`), else ``32-true``."""
    return BF16 if bf16_native() else FLOAT32


def config_value(value: Any) -> Any:
    """A constructor's default as config: an options dataclass (:class:`capsexp.nn.EMRouting`) as a node
    that builds it, a tuple as a list."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        kind = type(value)
        # capsexp's own options by where they are imported from (capsexp.nn), a plugin's by its module.
        own = kind.__module__ == Routing.__module__
        target = f"capsexp.nn.{kind.__name__}" if own else f"{kind.__module__}.{kind.__qualname__}"
        return {"_target_": target, **{f.name: config_value(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, (tuple, list)):
        return [config_value(item) for item in value]
    return value


def signature_node(target: str) -> dict[str, Any]:
    """``{_target_: target, argument: default, ...}`` for every keyword argument of ``target``'s
    constructor (``???`` where it has no default): every argument is then settable on the command
    line, and its default is declared only in the constructor. An options object (``routing``) is
    left to its own group (``model/routing``), which a model config chooses: merged over a node of
    other options, another algorithm's node would keep their keys."""
    parameters = inspect.signature(get_object(target)).parameters.values()
    keywords = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    arguments = [p for p in parameters if p.kind in keywords and not dataclasses.is_dataclass(p.default)]
    return {
        "_target_": target,
        **{p.name: MISSING if p.default is p.empty else config_value(p.default) for p in arguments},
    }


def keyword_names(target: str) -> list[str]:
    """The names :func:`signature_node` gives ``target``'s node (``capsexp.models.<Class>``), read from the
    source without importing it (importing a net imports torch: seconds): the class found through its
    package's ``__init__.py`` imports, then its ``__init__``'s keyword arguments, less those whose default
    is an object built by a call (the routing's options, left to ``model/routing``). For the command
    line's key checks; tests/test_stalls_typos.py holds it equal to the signature."""
    import ast
    import importlib.util

    package, _, name = target.rpartition(".")
    spec = importlib.util.find_spec(package)  # imports the packages above it, not this one
    assert spec is not None and spec.origin is not None, target
    folder = Path(spec.origin).parent
    imported = next(
        node.module
        for node in ast.parse(Path(spec.origin).read_text()).body
        if isinstance(node, ast.ImportFrom) and node.module and any(alias.name == name for alias in node.names)
    )
    source = folder / (imported.rpartition(".")[2] + ".py")
    tree = ast.parse(source.read_text())
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name)
    init = next(node for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    arguments = init.args.args[1:] + init.args.kwonlyargs
    defaults = [None] * (len(init.args.args) - 1 - len(init.args.defaults)) + init.args.defaults
    defaults += init.args.kw_defaults
    return [a.arg for a, d in zip(arguments, defaults, strict=True) if not isinstance(d, ast.Call)]


def store_net_keys() -> None:
    """Nodes of the nets (:data:`NETS`) holding their keys alone (values None), without importing torch:
    enough to check a command line's ``model.net.*`` keys. :func:`register` stores their real nodes."""
    for target in NETS:
        node = {"_target_": target, **dict.fromkeys(keyword_names(target))}
        ConfigStore.instance().store(group="model/net", name=target.rpartition(".")[2], node=node, package="model.net")


def register_routing() -> None:
    """The resolvers (``${project_root:}``, ``${stereo_channels:...}``, ``${image_folder_classes:...}``,
    ``${bf16_if_native:}``, and the run folders' ``${run_name:...}`` and ``${job_name:...}``) and the
    routing options (:data:`ROUTINGS`), without importing torch: what the command-line checks need."""
    resolvers = (
        ("project_root", lambda: str(working_root())),
        ("stereo_channels", smallnorb_channels),
        ("image_folder_classes", number_of_classes),
        ("bf16_if_native", bf16_if_native),
        ("run_name", run_name),
        ("job_name", job_name),
        ("verdict_arms", verdict_arms),
        ("reference_cells", reference_cells),
    )
    for name, resolver in resolvers:
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)
    for name, options in ROUTINGS.items():
        ConfigStore.instance().store(
            group="model/routing", name=name, node=config_value(options), package="model.net.routing"
        )
        # +routing=<name>: the routing a verdict judges (experiment=routing_verdict), read by its arms'
        # defaults as ${routing} and by its sweep as ${judged_routing}.
        ConfigStore.instance().store(group="routing", name=name, node={"judged_routing": name}, package="_global_")
        # A study's arm of each routing without an arm file of its own (a plugin's): +arm/routing=<name>.
        if not (CONFIG_DIR / "arm" / "routing" / f"{name}.yaml").is_file():
            arm = {"defaults": [{"override /model/routing": name}]}
            ConfigStore.instance().store(group="arm/routing", name=name, node=arm, package="_global_")
    # experiment=routing_reference: each routing's own verdict arms, beside the verdict's shared controls.
    for name, cell in own_cell_nodes(list(ROUTINGS)).items():
        ConfigStore.instance().store(group="arm/routing_verdict", name=name, node=cell, package="_global_")


def register() -> None:
    """Register everything ``conf/`` composes with: :func:`register_routing` and the nets (:data:`NETS`,
    which imports torch); calling it again stores the same nodes again."""
    register_routing()
    for target in NETS:
        ConfigStore.instance().store(
            group="model/net", name=target.rpartition(".")[2], node=signature_node(target), package="model.net"
        )


def compose(overrides: Sequence[str] = (), config_name: str = "config", with_hydra: bool = False) -> DictConfig:
    """``conf/<config_name>.yaml`` composed with ``overrides`` as the command line composes it, locations
    quoted as it quotes them (no run: Hydra's ``hydra.runtime`` keys, such as the output folder, are not set;
    ``with_hydra`` keeps the ``hydra`` node, whose ``runtime.choices`` name the config groups chosen)."""
    register()
    # Inside a running Hydra app (a sweep's after-sweep step) Hydra's global state is that app's: set aside
    # while composing, then put back.
    running = GlobalHydra.instance().hydra
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            overrides = quote_locations(overrides)
            return hydra_compose(config_name=config_name, overrides=overrides, return_hydra_config=with_hydra)
    finally:
        GlobalHydra.instance().hydra = running
