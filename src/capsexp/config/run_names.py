"""Run folders named by what was run, so that TensorBoard's run list (paths under ``logs/``) says it.

A single run: ``runs/<time>`` followed by its command-line overrides, ``runs/<time>_model=capsnet,seed=2``.
A job of a multirun: the overrides that differ across the sweep, ``multiruns/<time>/model=capsnet,seed=1``
(the values the sweep gives a key: ``model=lenet5,capsnet`` on the command line, or the sweeper's
``hydra.sweeper.params`` of an experiment config); an override every job shares is left out. Overrides
that only locate files (:func:`~capsexp.locations.is_location`) are left out of both: folder names
carry no machine's paths. ``/`` in a group name becomes ``.`` (``model/optimizer=sgd`` →
``model.optimizer=sgd``). Names longer than :data:`MAX_NAME` end in a digest of the whole name instead.
Hydra calls these resolvers from ``conf/hydra/default.yaml``; the run's exact overrides stay in its
``.hydra/overrides.yaml``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from capsexp.locations import is_location
from capsexp.overrides import key

MAX_NAME = 120  # characters of a run folder's name; file systems allow 255
DIGEST = 10  # hex digits of the digest that ends a shortened name


def _readable(overrides: Iterable[str]) -> str:
    """``key=value`` pairs joined by commas, ``/`` replaced (it would make subfolders), at most MAX_NAME long."""
    name = ",".join(o.replace("/", ".") for o in overrides if not is_location(key(o)))
    if len(name) > MAX_NAME:
        digest = hashlib.sha1(name.encode()).hexdigest()[:DIGEST]
        name = f"{name[: MAX_NAME - DIGEST - 1]}~{digest}"
    return name


def run_name(stamp: str, overrides: Iterable[str]) -> str:
    """``<stamp>`` or ``<stamp>_<overrides>``: a single run's folder name."""
    label = _readable(overrides)
    return f"{stamp}_{label}" if label else stamp


def job_name(overrides: Iterable[str], sweep_dir: str, job_number: int) -> str:
    """A multirun job's folder name: its overrides of the keys the sweep varies (read from Hydra's
    ``multirun.yaml`` in ``sweep_dir``); the job number where they name nothing, or where the sweep
    gives a key one value twice (two jobs would share a name)."""
    varied, repeated = _swept_keys(Path(sweep_dir) / "multirun.yaml")
    label = _readable(o for o in overrides if key(o) in varied)
    if not label:
        return str(job_number)
    return f"{label}_{job_number}" if repeated else label


def _swept_keys(multirun_file: Path) -> tuple[set[str], bool]:
    """The keys a multirun sweeps over (command line and ``hydra.sweeper.params``), and whether any
    of them is given the same value twice. Nothing where Hydra left no record (another sweeper)."""
    if not multirun_file.is_file():
        return set(), False
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    recorded = OmegaConf.load(multirun_file)
    arguments = [str(o) for o in OmegaConf.select(recorded, "hydra.overrides.task", default=[]) or []]
    params = OmegaConf.select(recorded, "hydra.sweeper.params", default=None) or {}
    arguments += [f"{name}={text}" for name, text in params.items()]
    varied, repeated = set(), False
    for override in OverridesParser.create().parse_overrides(arguments):
        if override.is_sweep_override():
            varied.add(key(override.get_key_element()))
            if override.is_discrete_sweep():
                values = list(override.sweep_string_iterator())
                repeated |= len(values) != len(set(values))
    return varied, repeated
