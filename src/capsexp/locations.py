"""What on a command line is a *location*, a file or folder of the machine (a checkpoint, images, a data
or run folder), and where capsexp's own files are.

capsexp prints run folders named by their overrides (``runs/<time>_model=capsnet,seed=1``) and users
paste them back: ``ckpt_path=logs/train/multiruns/<time>/model=capsnet,seed=1``. Hydra's override
grammar reads ``=`` in a value as an error and ``,`` as a sweep, so every command line of capsexp passes
through :func:`quote_locations` before Hydra parses it: a location's value that Hydra would not read back
as the text written is quoted (:func:`capsexp.overrides.hydra_value`). The same :func:`is_location` keeps
locations out of run folders' names, the HParams tab and results pages' configuration labels: where a
run's files were says nothing of what it ran.

Where capsexp's configs are (a checkout's ``conf/``, or the copy an installed package carries), where runs
and data go, and the names of the files a run leaves in its folder are declared here too, below every
module that reads or writes them.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable
from pathlib import Path

from capsexp.overrides import hydra_value, is_override, is_quoted, key, parsed, with_value, written

PACKAGE_DIR = Path(__file__).resolve().parent
# The checkout capsexp was imported from (the src/ layout: src/capsexp/ two folders below conf/), None for
# an installed package, whose wheel carries conf/ inside the package (setup.py).
_SOURCE = PACKAGE_DIR.parents[1]
CHECKOUT: Path | None = _SOURCE if PACKAGE_DIR.parent.name == "src" and (_SOURCE / "conf").is_dir() else None
CONFIG_DIR = CHECKOUT / "conf" if CHECKOUT else PACKAGE_DIR / "conf"


def working_root(folder: Path | None = None) -> Path:
    """The folder a run's ``logs/`` and ``data/`` go under (``paths.root_dir``): the working folder, or
    the checkout where the working folder is inside capsexp's own checkout (so ``make train`` and a
    command from ``experiments/`` write where they always have). A researcher's own folder, a routing
    package's say, gets its own ``logs/``, never the checkout's."""
    folder = (folder or Path.cwd()).resolve()
    return CHECKOUT if CHECKOUT and folder.is_relative_to(CHECKOUT) else folder


def shown_path(path: Path) -> Path:
    """``path`` relative to the working directory when inside it (what a user can paste)."""
    with contextlib.suppress(ValueError):
        return path.relative_to(Path.cwd().resolve())
    return path


def log_dir() -> Path:
    """Where runs are written unless the command line says otherwise: conf/paths/default.yaml's
    ``log_dir``, ``$CAPSEXP_LOG_DIR`` or ``logs/`` under :func:`working_root`."""
    return Path(os.environ.get("CAPSEXP_LOG_DIR") or working_root() / "logs")


def config_folders() -> list[Path]:
    """The folders of configs Hydra composes from, in its order: ``conf/``, then each folder a search path
    plugin adds (an installed routing package's ``conf/``: :mod:`hydra_plugins.capsexp_searchpath`)."""
    from hydra._internal.utils import create_config_search_path  # Hydra's own search path, plugins applied

    folders = [CONFIG_DIR]
    for element in create_config_search_path(str(CONFIG_DIR)).get_path():
        if element.path and element.path.startswith("file://"):
            folder = Path(element.path.removeprefix("file://")).resolve()
            if folder not in folders:
                folders.append(folder)
    return folders


def experiment_file(name: str) -> Path:
    """``experiment=<name>``'s file: the first of :func:`config_folders` holding ``experiment/<name>.yaml``
    (``conf/experiment/<name>.yaml``, which may not exist, where none does)."""
    found = (folder / "experiment" / f"{name}.yaml" for folder in config_folders())
    return next((path for path in found if path.is_file()), CONFIG_DIR / "experiment" / f"{name}.yaml")


def experiment_files() -> dict[str, Path]:
    """``{name: file}`` of every experiment config on the search path (``conf/``'s first where two share a name)."""
    files: dict[str, Path] = {}
    for folder in config_folders():
        for path in sorted((folder / "experiment").glob("*.yaml")):
            files.setdefault(path.stem, path)
    return files


def experiment_config(path: Path):
    """An experiment config's file (``conf/experiment/<name>.yaml``) as written (no interpolation resolved),
    over the experiments its defaults list extends (``- routing_verdict``), as composing would merge them: its
    budgets, ``requires`` and sweep. Its ``page`` is its file's own: what a page declares is not inherited."""
    from omegaconf import OmegaConf

    config = OmegaConf.load(path)
    extended = [
        path.with_name(f"{entry}.yaml")
        for entry in config.get("defaults") or []
        if isinstance(entry, str) and "/" not in entry and path.with_name(f"{entry}.yaml").is_file()
    ]
    if not extended:
        return config
    bases = [experiment_config(base) for base in extended]
    for base in bases:
        base.pop("page", None)
    return OmegaConf.merge(*bases, config)


def shown(config_file: Path) -> str:
    """A config file as a page or an error names it: ``conf/experiment/x.yaml``, or ``<package>/conf/...``
    for a package's (never a path of one machine)."""
    for folder in config_folders():
        if config_file.is_relative_to(folder):
            package = "" if folder == CONFIG_DIR else f"{folder.parent.name}/"
            return f"{package}conf/{config_file.relative_to(folder).as_posix()}"
    return config_file.name


# In a run's folder (logs/<task_name>/runs/<time>..., or a sweep's job folder):
RUN_CONFIG = Path(".hydra") / "config.yaml"  # the composed config
OVERRIDES = Path(".hydra") / "overrides.yaml"  # the command line's overrides
LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"  # the latest state, beside the best checkpoints

# The key of the run's own record in every checkpoint it writes (its resolved config, its command-line
# overrides, the code's revision, the class names): a lone .ckpt rebuilds its model from it.
RUN_RECORD = "capsexp"

# Keys that locate files: ``*_dir``/``*dir``/``dirpath``/``*_path``/``*root`` (data.data_dir,
# trainer.default_root_dir, a checkpoint callback's dirpath, ckpt_path, data.root, image_folder_root),
# the ``paths`` and ``hydra`` nodes, predict's ``images`` and the black-box attack's ``attack.source``.
_LOCATION_KEY = re.compile(
    r"(^|[/._])(dir|dirpath|path|root)$|_root$|^paths([/.]|$)|^hydra[/.]|^images$|^attack\.source$"
)
# Keys that name a run's place among others, not what it ran: with the locations, never part of a
# configuration's label on a results page.
LABEL_KEYS = ("task_name", "tags")
_DATA_LOCATIONS = ("paths.data_dir", "image_folder_root")  # locations of the data a run read, outside data.*


def is_location(name: str) -> bool:
    """Whether the override key ``name`` (``ckpt_path``, ``data.data_dir``, ``model/net``...) locates a file."""
    return bool(_LOCATION_KEY.search(key(name)))


def is_setting(argument: str) -> bool:
    """Whether the override ``argument`` says what a run ran (not where its files were, nor its task's name)."""
    name = key(argument)
    return not is_location(name) and name not in LABEL_KEYS


def is_relaunched(argument: str) -> bool:
    """Whether a step after a sweep passes the override ``argument`` on when it runs a run's configuration
    again (a test on other data, a capsule net matched to a CNN): what the run ran, and where its data is
    (``data.*``, ``paths.data_dir``, ``image_folder_root``); not where it wrote, nor what it read besides."""
    name = key(argument)
    return is_setting(argument) or name.startswith("data.") or name in _DATA_LOCATIONS


def quote_locations(arguments: Iterable[str]) -> list[str]:
    """``arguments`` with each location override whose value Hydra would not read as the text written
    quoted: a run or job folder's name with ``=`` and ``,``, a path with spaces or brackets. A value
    already quoted, a sweep over several existing files (``-m ckpt_path=a.ckpt,b.ckpt``), ``null`` and
    interpolations are left as they are."""
    quoted = []
    for argument in arguments:
        if not is_override(argument) or written(argument) is None or not is_location(key(argument)):
            quoted.append(argument)
            continue
        text = written(argument)
        override = parsed(argument)
        if override is None:  # Hydra's grammar refuses it: the text is the path
            needs_quotes = True
        elif override.is_sweep_override():  # a,b: one path that holds ",", or a sweep of paths
            needs_quotes = Path(text).expanduser().exists() or "=" in text
        else:
            read = override.value()
            needs_quotes = isinstance(read, str) and read != text and not is_quoted(text)
        quoted.append(with_value(argument, hydra_value(text)) if needs_quotes else argument)
    return quoted
