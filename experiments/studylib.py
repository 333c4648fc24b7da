"""What the analysis scripts of experiments/ share: the results folder, a run's overrides, paths as a
results page shows them."""

from __future__ import annotations

from pathlib import Path

from capsexp import PROJECT_ROOT

RESULTS = PROJECT_ROOT / "experiments" / "results"


def job_overrides(job: Path) -> list[str]:
    """A run's or a multirun job's command-line overrides (empty for a folder that is neither)."""
    import yaml

    path = job / ".hydra" / "overrides.yaml"
    return [str(o) for o in yaml.safe_load(path.read_text()) or []] if path.exists() else []


def display_path(path: Path) -> str:
    """``path`` relative to the repository when it lies inside (results pages hold no machine's paths)."""
    try:
        return str(Path(path).resolve().relative_to(PROJECT_ROOT.resolve()))
    except ValueError:
        return str(path)
