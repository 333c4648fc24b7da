"""What Hydra needs from capsexp to compose ``conf/``: the resolvers its YAML calls and the config
nodes kept in Hydra's ConfigStore. The command line registers them before Hydra composes; code that
composes the configs itself (tests, notebooks, benchmarks) calls :func:`compose`, or :func:`register`
before ``hydra.compose`` or before resolving a run's saved ``.hydra/config.yaml``.

Kept out of the package root so that importing ``capsexp.nn`` or ``capsexp.models`` loads neither
Hydra nor OmegaConf."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from capsexp import CONFIG_DIR, PROJECT_ROOT
from capsexp.routing_options import DynamicRouting, EMRouting


def smallnorb_channels(stereo: str) -> int:
    """``${stereo_channels:${data.stereo}}``: smallNORB's input channels for its stereo mode."""
    return 2 if stereo == "both" else 1


def register() -> None:
    """Register the resolvers (``${project_root:}``, ``${stereo_channels:...}``) and the routing
    options ``model/routing=em`` and ``model/routing=dynamic``; calling it again does nothing more.

    The routing options are taken from the defaults of :class:`capsexp.nn.EMRouting` and
    :class:`capsexp.nn.DynamicRouting` (their one home), not restated in YAML files."""
    for name, resolver in (("project_root", lambda: str(PROJECT_ROOT)), ("stereo_channels", smallnorb_channels)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)
    for name, options in (("em", EMRouting), ("dynamic", DynamicRouting)):
        node = {"_target_": f"capsexp.nn.{options.__name__}", **asdict(options())}
        ConfigStore.instance().store(group="model/routing", name=name, node=node, package="model.net.routing")


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """``conf/config.yaml`` composed with ``overrides`` as the command line composes it (no run:
    Hydra's ``hydra.runtime`` keys, such as the output folder, are not set)."""
    register()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))
