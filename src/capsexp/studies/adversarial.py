"""The adversarial study (Hinton, Sabour & Frosst 2018, section 6): the black-box step after the sweep,
and the page's accuracy-under-attack table.

Every run of the sweep attacks its own tested checkpoint (``attack=bim``: BIM, with FGSM at the same
eps beside it; white-box). :class:`BlackBox` then attacks each target net with examples crafted on the
source net's checkpoint (``attack.source``), one test-only run per target run, in ``blackbox/`` of the
sweep's folder.
"""

from __future__ import annotations

import logging
import os
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from capsexp.locations import is_relaunched
from capsexp.overrides import hydra_value
from capsexp.records.checkpoints import best_checkpoint
from capsexp.results.runs import Run, find_runs, group
from capsexp.results.study import StudyPage, matches
from capsexp.run.sweep_resume import after_sweep_arguments

log = logging.getLogger("capsexp")

BLACKBOX = "blackbox"  # the folder of the black-box runs, in the sweep's folder
_ATTACK = re.compile(r"^attack/(?P<name>[^/]+)/(?P<measure>acc|fgsm_acc|zero_gradient_fraction|unseen_input_fraction)$")


@dataclass
class BlackBox:
    """After the sweep: test each run of a ``targets`` configuration again (``train=false``, its best
    checkpoint), attacked by ``attack.source``, the best checkpoint of the ``source`` configuration's run
    of the same seed. ``source`` and ``targets`` are overrides that name configurations
    (``+arm/net=lenet5``)."""

    source: str
    targets: list[str] = field(default_factory=list)

    def __call__(self, folder: Path) -> None:
        runs = [run for run in find_runs(folder) if BLACKBOX not in run.folder.relative_to(folder).parts]
        sources = {run.seed: run for run in runs if matches(self.source, run.overrides)}
        for run in runs:
            if not any(matches(target, run.overrides) for target in self.targets) or run.seed not in sources:
                continue
            kept = [o for o in run.overrides if is_relaunched(o) and o not in ("-m", "--multirun")]
            arguments = [
                *kept,
                "train=false",
                f"ckpt_path={hydra_value(best_checkpoint(run.folder))}",
                f"++attack.source={hydra_value(best_checkpoint(sources[run.seed].folder))}",
                f"hydra.run.dir={hydra_value(folder / BLACKBOX / run.folder.name)}",
            ]
            arguments = after_sweep_arguments(arguments, folder / BLACKBOX / run.folder.name)
            if arguments is None:
                continue
            log.info(f"Black-box attack of {run.folder.name}: python -m capsexp {' '.join(arguments)}")
            subprocess.run([sys.executable, "-m", "capsexp", *arguments], check=True, env=dict(os.environ))


def attack_table(runs: list[Run], page: StudyPage, output: Path) -> str:
    """Accuracy (%) per eps under each attack, mean over the runs of each configuration: BIM and FGSM
    white-box, then the black-box attacks; with the fraction of zero input gradients and of input
    positions no class score depends on (where a white-box attack cannot move an image)."""
    rows: dict[tuple[str, str], dict] = {}
    for configuration in group(runs):
        for run in configuration.runs:
            for tag, points in run.scalars.items():
                match = _ATTACK.match(tag)
                if not match:
                    continue
                name, measure = match["name"], match["measure"]
                if measure == "fgsm_acc":
                    name, measure = name.replace("bim", "fgsm", 1), "acc"
                row = rows.setdefault((configuration.label, name), {})
                if measure == "acc":
                    for step, value in points:
                        row.setdefault(step, []).append(value)
                else:
                    row.setdefault(measure, []).append(points[-1][1])
    if not rows:
        return ""
    steps = sorted({s for row in rows.values() for s in row if isinstance(s, int)})
    lines = [
        "| configuration | attack | "
        + " | ".join(f"eps {s / 1000:g}" for s in steps)
        + " | zero input gradients (%) | input positions never seen (%) |",
        "| --- | --- |" + " ---: |" * (len(steps) + 2),
    ]
    order = sorted(rows, key=lambda key: ("blackbox" in key[1], key[1], key[0]))
    for label, name in order:
        row = rows[label, name]
        cells = [f"{100 * statistics.fmean(row[s]):.2f}" if s in row else "" for s in steps]
        cells += [
            f"{100 * statistics.fmean(row[m]):.2f}" if m in row else ""
            for m in ("zero_gradient_fraction", "unseen_input_fraction")
        ]
        lines.append(f"| {label} | {name} | " + " | ".join(cells) + " |")
    return (
        "## Accuracy (%) under attack\n\n"
        "Untargeted, L-inf, pixel values in [0, 1], mean over the runs of each configuration; eps 0 is the clean "
        "accuracy on the attacked images. `bim`: 10 steps of 0.2 eps, `fgsm`: one step of eps (white-box, "
        "crafted on the attacked net); `*_blackbox`: crafted on the source net's checkpoint. A BIM accuracy "
        "above FGSM's at the same eps would signal masked gradients.\n\n" + "\n".join(lines) + "\n"
    )
