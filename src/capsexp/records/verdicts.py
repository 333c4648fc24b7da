"""The routings' verdicts a reference page found (experiment=routing_reference), kept beside it as
``verdicts.json`` (:data:`VERDICTS`) for the model cards of later runs: a card of a net with one of these
routings quotes its verdict, and where it was found. A checkout reads them from ``experiments/results/``;
a built package carries copies (setup.py) in ``capsexp/verdicts/``.

The file: ``{"page": "experiments/results/<folder>", "setting": "<what the runs were>", "verdicts":
{"<routing>": {"<question>": "<verdict>", ...}, ...}}``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from capsexp.locations import CHECKOUT, PACKAGE_DIR

VERDICTS = "verdicts.json"
PACKAGED = PACKAGE_DIR / "verdicts"  # a built package's copies, one per page: <page folder name>.json


def write_verdicts(folder: Path, page: str, setting: str, verdicts: Mapping[str, Mapping[str, str]]) -> Path:
    """``verdicts.json`` in a page's ``folder``: each routing's answers, the page they come from (as a
    checkout names it) and what its runs were."""
    path = folder / VERDICTS
    path.write_text(json.dumps({"page": page, "setting": setting, "verdicts": verdicts}, indent=1) + "\n")
    return path


def verdict_files() -> list[Path]:
    """The verdict files there are: a checkout's pages', else the package's copies."""
    if CHECKOUT is not None:
        return sorted((CHECKOUT / "experiments" / "results").glob(f"*/{VERDICTS}"))
    return sorted(PACKAGED.glob("*.json"))


def verdict_of(routing: str) -> list[dict]:
    """Each page's verdict on ``routing``: ``{"page", "setting", "answers"}``, none where no page judged it."""
    found = []
    for path in verdict_files():
        record = json.loads(path.read_text())
        if routing in record.get("verdicts", {}):
            found.append({"page": record["page"], "setting": record["setting"], "answers": record["verdicts"][routing]})
    return found
