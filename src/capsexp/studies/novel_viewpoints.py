"""The EM paper's novel-viewpoint experiment (Hinton, Sabour & Frosst 2018, section 5.1, Table 2):
a CNN and a capsule net trained on the familiar viewpoints of smallNORB (``data.viewpoint=azimuth`` or
``elevation``, ``data.familiar=true``), the capsule net stopped when its validation accuracy reaches
the CNN's best (Lightning's EarlyStopping with ``stopping_threshold``: matched familiar accuracy), then
each tested on the novel viewpoints from the same best checkpoint.

The sweep trains the CNN per protocol; :class:`MatchedCapsules` and :class:`NovelViewpoints` are its
``after_sweep`` steps; :func:`table_2` is its page's table.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from capsexp.locations import is_relaunched
from capsexp.overrides import hydra_value
from capsexp.records.checkpoints import best_checkpoint
from capsexp.records.metric_names import TEST_ACC, VAL_ACC_BEST
from capsexp.results.runs import Run, find_runs
from capsexp.results.study import StudyPage, figure_for
from capsexp.run.sweep_resume import after_sweep_arguments

log = logging.getLogger("capsexp")

CAPSULES, NOVEL = "capsules", "novel"  # folders of the after-sweep runs, in the sweep's folder
NOVEL_TEST = ["train=false", "data.familiar=false"]  # a novel-viewpoint test run's overrides
# EarlyStopping stops above its threshold (strictly): just below the CNN's accuracy, so that reaching it counts.
MATCH_TOLERANCE = 1e-6


def _own_overrides(run: Run) -> list[str]:
    return [o for o in run.overrides if is_relaunched(o)]


def _capsexp(arguments: list[str], folder: Path) -> None:
    """``python -m capsexp <arguments> hydra.run.dir=<folder>``, unless it finished there before (a sweep
    run again), going on from its saved state where it has one."""
    given = after_sweep_arguments([*arguments, f"hydra.run.dir={hydra_value(folder)}"], folder)
    if given is not None:
        log.info(f"python -m capsexp {' '.join(given)}")
        subprocess.run([sys.executable, "-m", "capsexp", *given], check=True)


def _sweep_runs(folder: Path) -> list[Run]:
    """The sweep's own jobs (the CNN's), not the runs of the steps after it."""
    return [run for run in find_runs(folder) if run.folder.parent == folder]


@dataclass
class MatchedCapsules:
    """For each CNN run of the sweep, train ``model`` with its overrides until its validation accuracy
    reaches that run's best (or ``overrides``' budget ends), into ``capsules/<job>``."""

    model: str
    overrides: list[str] = field(default_factory=list)

    def __call__(self, folder: Path) -> None:
        for run in _sweep_runs(folder):
            threshold = run.final(VAL_ACC_BEST)
            _capsexp(
                [
                    *_own_overrides(run),
                    f"model={self.model}",
                    "callbacks=[default,stop_at_accuracy]",
                    f"callbacks.stop_at_accuracy.stopping_threshold={threshold - MATCH_TOLERANCE:.7f}",
                    *self.overrides,
                ],
                folder / CAPSULES / run.folder.name,
            )


@dataclass
class NovelViewpoints:
    """Test every trained run (the CNN's and the capsule net's) on the novel viewpoints from its best
    checkpoint, into ``novel/<its path under the sweep's folder>``."""

    def __call__(self, folder: Path) -> None:
        for run in find_runs(folder):
            where = run.folder.relative_to(folder)
            if where.parts[0] == NOVEL or "train=false" in run.overrides:
                continue
            _capsexp(
                [
                    *_own_overrides(run),
                    *NOVEL_TEST,
                    f"ckpt_path={hydra_value(best_checkpoint(run.folder))}",
                ],
                folder / NOVEL / where,
            )


def _viewpoint(run: Run) -> str:
    return run.choice("data.viewpoint") or ""


def table_2(runs: list[Run], page: StudyPage, output: Path) -> str:
    """Per trained run: the threshold it was stopped at, its best validation accuracy, whether it
    reached the CNN's, its test error on the familiar and on the novel viewpoints; the paper's Table 2
    beside (``page.paper.figures`` keyed by viewpoint: "familiar; novel CNN / novel capsules")."""
    novel = {
        tuple(o for o in _own_overrides(run) if o not in NOVEL_TEST): run
        for run in runs
        if "train=false" in run.overrides
    }
    lines = [
        "## Novel viewpoints (the EM paper's Table 2)",
        "",
        "Test error (%) of each run's best checkpoint on the viewpoints it trained on and on the others. The "
        "capsule net trains until its validation accuracy reaches the CNN's best (the threshold) or its budget "
        "ends, as the paper matches the two nets on the familiar viewpoints.",
        "",
        "| model | viewpoint | seed | threshold (%) | best val acc (%) | matched | familiar error | novel error "
        "| paper: familiar; novel CNN / capsules |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | --- |",
    ]
    trained = [run for run in runs if "train=false" not in run.overrides]
    for run in trained:
        test = novel.get(tuple(_own_overrides(run)))
        threshold = run.choice("callbacks.stop_at_accuracy.stopping_threshold")
        best = run.final(VAL_ACC_BEST)
        if threshold is None:
            matched, threshold_text = "(the CNN)", ""
        else:
            reached = best is not None and best >= float(threshold) - MATCH_TOLERANCE
            matched, threshold_text = ("yes" if reached else "no: budget ended first"), f"{100 * float(threshold):.2f}"
        familiar, novel_acc = run.final(TEST_ACC), test.final(TEST_ACC) if test else None
        paper = figure_for(page.paper.figures, run.overrides) if page.paper else None
        lines.append(
            f"| {run.choice('model') or ''} | {_viewpoint(run)} | {'' if run.seed is None else run.seed} "
            f"| {threshold_text} | {'' if best is None else f'{100 * best:.2f}'} | {matched} "
            f"| {'' if familiar is None else f'{100 * (1 - familiar):.2f}'} "
            f"| {'' if novel_acc is None else f'{100 * (1 - novel_acc):.2f}'} | {paper or ''} |"
        )
    return "\n".join(lines) + "\n"
