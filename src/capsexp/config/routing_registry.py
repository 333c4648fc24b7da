"""The routing algorithms capsexp knows: every entry point of the group ``capsexp.routing`` of the installed
packages, capsexp's own included (``pyproject.toml``), each ``model/routing=<its name>``.

An entry point names a routing's options: its frozen dataclass (built with its defaults) or an instance of
it (``em_paper``: EM's options as the paper has them), deriving from
:class:`~capsexp.config.routing_options.Routing`, whose ``router`` names what routes. capsexp's own come
first, then the other packages', each by name (an installed package's metadata lists its entry points
sorted, whatever order ``pyproject.toml`` gives them). Loaded once a process;
what a package gets wrong is a :class:`~capsexp.errors.ConfigError` naming the package and the entry point.

A package's own configs (a study of its routing, ``experiment=<name>``) live in a ``conf/`` folder of its
top-level package (:func:`config_folders`), which Hydra searches after capsexp's ``conf/``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from capsexp.config.routing_options import Routing
from capsexp.errors import ConfigError

GROUP = "capsexp.routing"
OWN = "capsexp"  # the distribution whose entry points are the built-in routings


@functools.cache
def registered() -> dict[str, Routing]:
    """``{name: options}`` of every registered routing (see the module docstring)."""
    points = list(entry_points(group=GROUP))
    own = sorted((point for point in points if _distribution(point) == OWN), key=lambda point: point.name)
    if not own:
        raise ConfigError(
            f"capsexp's built-in routings are not registered (no entry points of the group {GROUP}): install "
            "capsexp (make install, or pip install -e .) rather than running it from its source folder"
        )
    others = sorted((point for point in points if _distribution(point) != OWN), key=lambda point: point.name)
    routings: dict[str, Routing] = {}
    sources: dict[str, str] = {}
    for point in [*own, *others]:
        where = f"entry point {point.name} = {point.value} of {_distribution(point)} (group {GROUP})"
        if point.name in routings:
            raise ConfigError(f"{where}: the name {point.name} is taken already by {sources[point.name]}")
        routings[point.name], sources[point.name] = _options(point, where), where
    return routings


def built_in() -> dict[str, Routing]:
    """``{name: options}`` of capsexp's own routings (what its own tests cover, whatever else is installed)."""
    own = {point.name for point in entry_points(group=GROUP) if _distribution(point) == OWN}
    return {name: options for name, options in registered().items() if name in own}


def config_folders() -> dict[str, Path]:
    """``{package: folder}``: the ``conf/`` folder of each top-level package that registers a routing
    (capsexp's own aside), where it has one; on Hydra's search path after capsexp's ``conf/``."""
    registered()  # loads, and so checks, every entry point first
    packages = sorted(
        {point.module.partition(".")[0] for point in entry_points(group=GROUP) if _distribution(point) != OWN}
    )
    folders = {package: Path(str(importlib.resources.files(package) / "conf")) for package in packages}
    return {package: folder for package, folder in folders.items() if folder.is_dir()}


def _distribution(point: EntryPoint) -> str:
    return point.dist.name if point.dist is not None else "an unknown package"


def _options(point: EntryPoint, where: str) -> Routing:
    try:
        loaded = point.load()
    except Exception as error:
        raise ConfigError(f"{where}: cannot be loaded ({type(error).__name__}: {error})") from None
    options = loaded() if isinstance(loaded, type) else loaded
    if not (dataclasses.is_dataclass(options) and isinstance(options, Routing)):
        raise ConfigError(
            f"{where}: names {loaded!r}, not a routing's options (a frozen dataclass deriving from "
            "capsexp.nn.Routing, or an instance of one)"
        )
    if not type(options).router:
        raise ConfigError(f"{where}: {type(options).__name__} names no router (set router = 'module:name')")
    return options
