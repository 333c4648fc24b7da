"""What a results page keeps of its runs (``--keep-runs``): kilobytes a run, in ``runs/`` beside the
page, from which the page rebuilds on any machine; the composed configs without this machine's paths."""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from capsexp.locations import RUN_CONFIG, is_setting
from capsexp.overrides import key as override_key
from capsexp.records.events import copy_events, event_files, event_folder
from capsexp.records.machine import MACHINE_FILE
from capsexp.records.metric_names import MODEL_FLOPS, MODEL_PARAMETERS, RECONSTRUCTIONS
from capsexp.records.revision import REVISION_FILE
from capsexp.results.runs import KEPT_ORDER, KEPT_RUNS, OVERRIDES, OVERRIDES_AS_RUN, SWEEP_COMMAND, Run, launches

DRAWN_IMAGES = (RECONSTRUCTIONS,)  # the images a page draws from its runs (studies.sabour2017); no other is kept
RECORDED_HPARAMS = "hparams.yaml"  # the Lightning logger's record of the run's config, beside its event files


def keep_runs(runs: list[Run], folder: Path, output: Path) -> Path:
    """Copy what a page needs of each run (overrides, machine and code records, the composed config without
    absolute paths (:func:`without_locations`), event files without the images no page draws, the model's
    recorded parameters and FLOPs: kilobytes) into ``output/runs/`` (replacing what it held), by the runs'
    paths under ``folder``. Overrides that name this machine's folders (``hydra.sweep.dir=...``,
    ``ckpt_path=...``) are left out."""
    kept = output / KEPT_RUNS
    if kept.resolve() == folder.resolve():
        return kept  # rebuilding from the kept runs: they stay as they are
    if kept.exists():
        shutil.rmtree(kept)
    kept.mkdir(parents=True)
    for home, given, _ in launches(runs, folder):
        if given is not None:
            (kept / home.relative_to(folder)).mkdir(parents=True, exist_ok=True)
            (kept / home.relative_to(folder) / SWEEP_COMMAND).write_text(yaml.safe_dump(given))
    (kept / KEPT_ORDER).write_text(yaml.safe_dump([run.folder.relative_to(folder).as_posix() for run in runs]))
    for run in runs:
        target = kept / run.folder.relative_to(folder)
        (target / OVERRIDES).parent.mkdir(parents=True, exist_ok=True)
        overrides = [o for o in run.overrides if is_setting(o) or override_key(o) == "task_name"]
        (target / OVERRIDES).write_text(yaml.safe_dump(overrides))
        if (run.folder / OVERRIDES_AS_RUN).exists():
            shutil.copy2(run.folder / OVERRIDES_AS_RUN, target / OVERRIDES_AS_RUN)
        for record in (MACHINE_FILE, REVISION_FILE):
            if (run.folder / record).exists():
                shutil.copy2(run.folder / record, target / record)
        if (run.folder / RUN_CONFIG).exists():  # the composed config, this machine's paths left out
            (target / RUN_CONFIG).write_text(
                OmegaConf.to_yaml(without_locations(OmegaConf.load(run.folder / RUN_CONFIG)))
            )
        events_to = target / event_folder(run.folder).relative_to(run.folder)  # the run's layout
        events_to.mkdir(exist_ok=True)
        for events in event_files(run.folder):  # without the images no page draws
            copy_events(events, events_to / events.name, images=DRAWN_IMAGES)
        recorded_file = event_folder(run.folder) / RECORDED_HPARAMS
        if recorded_file.exists():  # the model's cost the run recorded; no paths
            recorded = yaml.safe_load(recorded_file.read_text()) or {}
            cost = {key: recorded[key] for key in (MODEL_PARAMETERS, MODEL_FLOPS) if key in recorded}
            (events_to / RECORDED_HPARAMS).write_text(yaml.safe_dump(cost))
    return kept


MACHINE_PATH = "<a path on the machine that ran it>"  # what a kept config holds in place of a path


def without_locations(config: DictConfig) -> DictConfig:
    """``config`` with every absolute path (a value, not an interpolation: a command-line
    ``paths.data_dir=/data/...``, ``hydra.run.dir``...) replaced by :data:`MACHINE_PATH`, so that a kept
    config names no machine's folders; the rest as the run composed it."""

    def scrub(node: DictConfig | ListConfig) -> None:
        for key in range(len(node)) if isinstance(node, ListConfig) else list(node.keys()):
            child = node._get_node(key)
            if isinstance(child, (DictConfig, ListConfig)):
                scrub(child)
            elif not child._is_interpolation() and isinstance(child._value(), str) and os.path.isabs(child._value()):
                node[key] = MACHINE_PATH

    config = copy.deepcopy(config)
    scrub(config)
    return config
