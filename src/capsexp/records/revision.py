"""The code a run ran, written beside its config (``revision.yaml``): the git commit of the checkout
capsexp was imported from, whether its tree had uncommitted changes, and a hash of those changes, so
that a results page can say which code produced its figures, and a reader can tell two runs of
different code apart even when both ran from the same commit.

Outside a git checkout (capsexp installed from a wheel) the record holds the package version alone.

A job records the code of the process that ran it (:func:`of_this_process`), read when the process
imported the run's code, not when the job started: a launcher's long-lived worker (joblib's) runs many
jobs with the code it imported once, whatever the checkout holds by the time each starts.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from capsexp.locations import CHECKOUT

REVISION_FILE = "revision.yaml"
_GIT_TIMEOUT_S = 20  # a git that hangs (a network file system) must not hold up a run
# Where an untracked file is code (git pathspecs): the package, its configs, tests and scripts, its build.
CODE = ("src", "conf", "tests", "experiments/*.py", "pyproject.toml", "setup.py", "Makefile")


def _git(*arguments: str, root: Path) -> bytes | None:
    """git's output as bytes (a diff of a file that is not UTF-8 is no text), None where git fails."""
    try:
        done = subprocess.run(["git", *arguments], cwd=root, capture_output=True, timeout=_GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def describe(root: Path | None = CHECKOUT) -> dict[str, Any]:
    """``{"version", "commit", "dirty", "diff_sha256"}`` of the checkout at ``root``: the commit (None
    outside git), whether the code differs from it (a tracked file changed, or an untracked file in
    :data:`CODE`), and the SHA-256 of ``git diff HEAD`` (bytes) followed by those untracked files' names
    and contents (None when clean). Untracked files elsewhere (a user's images, logs) are not code."""
    record: dict[str, Any] = {"version": _version(), "commit": None, "dirty": None, "diff_sha256": None}
    # An installed package has no checkout: git would answer for whatever repository holds site-packages.
    commit = None if root is None else _git("rev-parse", "HEAD", root=root)
    if commit is None:
        return record
    record["commit"] = commit.decode().strip()
    diff = _git("diff", "HEAD", "--binary", root=root) or b""
    untracked = (_git("ls-files", "--others", "--exclude-standard", "-z", "--", *CODE, root=root) or b"").split(b"\0")
    untracked = sorted(filter(None, untracked))
    record["dirty"] = bool(diff or untracked)
    if record["dirty"]:
        digest = hashlib.sha256(diff)
        for name in untracked:
            digest.update(name + b"\0")
            with contextlib.suppress(OSError):  # removed meanwhile, or unreadable: its name alone
                digest.update((root / os.fsdecode(name)).read_bytes())
        record["diff_sha256"] = digest.hexdigest()
    return record


_AT_IMPORT: dict[str, dict[str, Any]] = {}  # root -> its revision when this process first asked


def at_import(root: Path | None = CHECKOUT) -> dict[str, Any]:
    """The checkout's revision the first time this process asks (:mod:`capsexp.run.train` asks when it is
    imported), the same record after."""
    key = str(root)
    if key not in _AT_IMPORT:
        _AT_IMPORT[key] = describe(root)
    return _AT_IMPORT[key]


def of_this_process(root: Path | None = CHECKOUT) -> dict[str, Any]:
    """What a job records: the code this process imported (:func:`at_import`), and, where the checkout
    has changed since, its revision now under ``changed_since_import`` (a module the job imports for the
    first time comes from the changed checkout)."""
    record = dict(at_import(root))
    now = describe(root)
    if now != record:
        record["changed_since_import"] = now
    return record


def _version() -> str:
    try:
        return importlib.metadata.version("capsexp")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def short(record: dict[str, Any] | None) -> str:
    """One word for a page: ``e5538d9``, ``e5538d9+changes 3f2a9c1b`` (uncommitted changes, their hash's
    first 8 digits), ``0.1.0 (no git)``, or ``not recorded``; a run resumed by other code names each,
    ``ab12cd3, then e5538d9``."""
    if not record:
        return "not recorded"
    if record.get("earlier"):
        return ", then ".join(short({**r, "earlier": None}) for r in [*record["earlier"], record])
    if not record.get("commit"):
        return f"{record.get('version', '?')} (no git)"
    text = str(record["commit"])[:7]
    if record.get("dirty"):
        text += f"+changes {str(record.get('diff_sha256') or '')[:8]}"
    if record.get("changed_since_import"):
        text += f" (the checkout then {short({**record['changed_since_import'], 'earlier': None})})"
    return text


def write_revision(run_folder: Path, record: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``record`` (default: :func:`describe`) as the run's ``revision.yaml``; return it. A run resumed
    by other code than it ran before keeps the earlier records, oldest first, under ``earlier``."""
    record = dict(describe() if record is None else record)
    previous = read_revision(run_folder)
    if previous is not None:
        earlier = previous.pop("earlier", [])
        earlier += [previous] if previous != record else []
        if earlier:
            record["earlier"] = earlier
    (run_folder / REVISION_FILE).write_text(yaml.safe_dump(record, sort_keys=False))
    return record


def read_revision(run_folder: Path) -> dict[str, Any] | None:
    """What :func:`write_revision` recorded in ``run_folder``; None for a run without the record."""
    path = run_folder / REVISION_FILE
    return yaml.safe_load(path.read_text()) if path.exists() else None
