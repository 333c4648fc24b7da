"""Code of another git revision beside this tree's, for the benchmarks that compare with it (no capsexp
import here: a benchmark's worker may import another revision's capsexp)."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]


def tree_at(revision: str, *folders: str, option: str = "--baseline") -> Path:
    """``folders`` (``src``, ``conf``) as they are at a git revision, in a temporary folder; a short exit
    naming ``option`` where git cannot show them."""
    archive = subprocess.run(["git", "archive", revision, *folders], cwd=PROJECT, capture_output=True)
    if archive.returncode != 0:
        shown = " and ".join(f"{folder}/" for folder in folders)
        sys.exit(f"{option} {revision}: git cannot show {shown} there: {archive.stderr.decode().strip()}")
    root = Path(tempfile.mkdtemp(prefix="capsexp_revision_"))
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as files:
        files.extractall(root, filter="data")
    return root
