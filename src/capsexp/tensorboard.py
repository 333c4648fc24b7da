"""Serve runs in TensorBoard so that its first view answers "which is better":
``python -m capsexp.tensorboard [logs] [--port 6006]`` (``make tensorboard``).

TensorBoard names a run by its path under the folder it serves, ``train/multiruns/<time>/<job>``, and
its run list and legends cut names at about 45 characters: before the part that differs. Each run is
served here under a short name that starts with what differs between the runs served, by short keys
(``max_steps=600,seed=2``), then its day and time, through a folder of links that is kept up to date
while the server runs, so runs started later appear too.

The URL printed pins the accuracy curves at the top of the Time Series tab. The HParams tab takes its
columns from one experiment summary: a run of links holds one made from every run's choices (each run
writes only its own session), so that choices made by some runs only (``model/routing``) are columns too,
those that differ between the runs marked so: the tab ticks them, the seed included.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections import Counter
from pathlib import Path

import yaml

from capsexp.locations import OVERRIDES, is_setting, log_dir
from capsexp.overrides import is_override, key, written
from capsexp.records.events import load_events
from capsexp.records.metric_names import PLAIN, PRESENCE_GAP, TEST_ACC, VAL_ACC, VAL_ACC_BEST
from capsexp.run.hparams import LEADING_COLUMNS, metric_names

EVENTS = "events.out.tfevents.*"
PINNED = (VAL_ACC, VAL_ACC_BEST, TEST_ACC)  # the cards the URL pins, in this order
COLUMNS_RUN = "(hparams columns)"  # the run that holds the experiment summary; "(" sorts before names
RESCAN_S = 30  # how often new runs are linked while serving
_UNSAFE = re.compile(r"[^\w=.,+@%~() -]")


def run_folders(root: Path) -> list[Path]:
    """Folders under ``root`` holding event files, in path order (a run's checkpoints hold none)."""
    return sorted({path.parent for path in root.rglob(EVENTS)})


_STAMP = re.compile(r"^\d{4}-(\d\d-\d\d)_(\d\d-\d\d-\d\d)(?:-\d+)?(?:_(.*))?$")  # conf/hydra/default.yaml's


def _when_and_label(folder: Path, root: Path) -> tuple[str, str] | None:
    """A run folder's start (``11-27 20-48`` for a sweep's job, to the second for a single run) and the
    overrides its name holds; None for a folder not laid out as capsexp lays runs out."""
    parts = folder.relative_to(root).parts or (folder.name,)  # a run served on its own: by its folder's name
    for index, part in enumerate(parts):
        found = _STAMP.match(part)
        if found:
            day, clock, single = found.groups()
            rest = "/".join(parts[index + 1 :])
            return f"{day} {clock[:5] if rest else clock}", rest or single or ""
    return None


def _settings(folder: Path, label: str) -> dict[str, str]:
    """What the run ran, ``{key: value}``: its recorded command-line overrides (``.hydra/overrides.yaml``),
    else those its folder's name holds; locations and the task's name left out."""
    recorded = folder / OVERRIDES
    if recorded.is_file():
        overrides = [str(o) for o in yaml.safe_load(recorded.read_text()) or []]
    else:
        overrides = [o for o in label.split(",") if "=" in o]  # a job folder's name: key=value,key=value
    return {key(o).replace("/", "."): written(o) for o in overrides if is_override(o) and is_setting(o)}


def _short_keys(keys: list[str]) -> dict[str, str]:
    """Each key by its last part (``trainer.max_steps`` -> ``max_steps``), more of it where two would
    share a name."""
    short = {}
    for name in keys:
        parts = name.split(".")
        for depth in range(1, len(parts) + 1):
            candidate = ".".join(parts[-depth:])
            others = [other for other in keys if other != name and other.split(".")[-depth:] == parts[-depth:]]
            if not others:
                break
        short[name] = candidate
    return short


def served_names(folders: list[Path], root: Path) -> dict[Path, str]:
    """The name each run is served under: how it differs from the runs served, by short keys
    (``max_steps=600,seed=2``), then when it started (``(11-27 20-48)``). Of each key that varies, a run
    names its value unless more than half of the runs share it (that value goes without saying); a run
    with the shared value of every key names them all, and a lone run its every override. TensorBoard's
    run list shows about 30 characters of a name: what differs comes first, where the cut does not reach
    it. Folders not laid out as capsexp lays runs out keep their path."""
    laid_out = {folder: found for folder in folders if (found := _when_and_label(folder, root))}
    settings = {folder: _settings(folder, label) for folder, (_, label) in laid_out.items()}
    keys = list(dict.fromkeys(k for values in settings.values() for k in values))
    varying = [k for k in keys if len({values.get(k) for values in settings.values()}) > 1] or keys
    short = _short_keys(varying)
    commonest = {}  # each key's value shared by most of the runs, where more than half share one
    for k in varying:
        value, count = Counter(values.get(k) for values in settings.values()).most_common(1)[0]
        if count > len(settings) / 2:
            commonest[k] = value
    names = {}
    for folder in folders:
        if folder not in laid_out:
            names[folder] = _UNSAFE.sub("_", " ".join(folder.relative_to(root).parts) or folder.name)
            continue
        own = settings[folder]
        differs = [k for k in varying if k in own and own[k] != commonest.get(k, ...)] or [
            k for k in varying if k in own
        ]
        what = ",".join(f"{short[k]}={own[k]}" for k in differs)
        when = laid_out[folder][0]
        names[folder] = _UNSAFE.sub("_", f"{what} ({when})" if what else when)
    return names


def link_runs(root: Path, links: Path) -> int:
    """Link every run under ``root`` into ``links`` by its :func:`served_names` name (numbered where two
    share one); return how many new links were made. A run linked already keeps its name."""
    present = {os.readlink(link) for link in links.iterdir() if link.is_symlink()}
    folders = run_folders(root)
    names = served_names(folders, root)
    made = 0
    for folder in folders:
        if str(folder.resolve()) in present:
            continue
        name, number = names[folder], 2
        while (links / name).exists() or (links / name).is_symlink():
            name, number = f"{names[folder]} #{number}", number + 1
        (links / name).symlink_to(folder.resolve(), target_is_directory=True)
        made += 1
    return made


def write_columns(folders: list[Path], target: Path) -> None:
    """An HParams experiment summary into ``target``: every hyperparameter any run's session names
    (the first value seen sets its type), those whose value differs between the runs (or that some runs
    lack) marked so and first, the leading choices first among each; and as metrics
    :func:`~capsexp.run.hparams.metric_names` of every test set and score any run logged. TensorBoard's
    HParams view ticks the first five hyperparameters after sorting those that differ first: what the
    runs differ by, the seed included, is shown; what they share is listed unticked."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
    from torch.utils.tensorboard import SummaryWriter

    hyperparameters: dict = {}
    values: dict[str, set] = {}  # each hyperparameter's values, and in how many runs it is set
    counts: dict[str, int] = {}
    sessions = 0
    logged: set[str] = set()
    for folder in folders:
        events = load_events(folder, scalars=1, tensors=1)
        logged.update(events.Tags()["scalars"])
        try:
            session = events.PluginTagToContent(metadata.PLUGIN_NAME).get(metadata.SESSION_START_INFO_TAG)
        except KeyError:  # a run that wrote no hyperparameters
            session = None
        if session is None:
            continue
        sessions += 1
        for name, value in metadata.parse_session_start_info_plugin_data(session).hparams.items():
            kind = value.WhichOneof("kind")
            hyperparameters.setdefault(name, kind)
            values.setdefault(name, set()).add(getattr(value, kind))
            counts[name] = counts.get(name, 0) + 1
    if not hyperparameters:
        return
    differs = {name for name, seen in values.items() if len(seen) > 1 or counts[name] < sessions}
    test_sets = [PLAIN, *sorted(tag.removeprefix(f"{TEST_ACC}_") for tag in logged if tag.startswith(f"{TEST_ACC}_"))]
    metrics = [name for name in metric_names(test_sets, presence=PRESENCE_GAP in logged) if name in logged]
    leading = [name for name in LEADING_COLUMNS if name in hyperparameters]
    ordered = [*leading, *sorted(set(hyperparameters) - set(leading))]
    ordered = [name for name in ordered if name in differs] + [name for name in ordered if name not in differs]
    types = {
        "string_value": api_pb2.DATA_TYPE_STRING,
        "bool_value": api_pb2.DATA_TYPE_BOOL,
        "number_value": api_pb2.DATA_TYPE_FLOAT64,
    }
    infos = [
        api_pb2.HParamInfo(name=name, type=types[hyperparameters[name]], differs=name in differs) for name in ordered
    ]
    experiment = api_pb2.Experiment(
        hparam_infos=infos, metric_infos=[api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag)) for tag in metrics]
    )
    data = plugin_data_pb2.HParamsPluginData(experiment=experiment, version=metadata.PLUGIN_DATA_VERSION)
    summary = Summary(
        value=[Summary.Value(tag=metadata.EXPERIMENT_TAG, metadata=metadata.create_summary_metadata(data))]
    )
    with SummaryWriter(str(target)) as writer:
        writer._get_file_writer().add_summary(summary)


def url(port: int) -> str:
    """TensorBoard's address with the accuracy cards pinned at the top of its Time Series tab."""
    pinned = json.dumps([{"plugin": "scalars", "tag": tag} for tag in PINNED], separators=(",", ":"))
    return f"http://localhost:{port}/?pinnedCards={urllib.parse.quote(pinned)}#timeseries"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m capsexp.tensorboard", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "root", nargs="?", type=Path, help="the runs' folder, or one run's (default: $CAPSEXP_LOG_DIR or ./logs)"
    )
    parser.add_argument("--port", type=int, default=6006)
    args = parser.parse_args(argv)
    args.root = args.root or log_dir()
    if not args.root.is_dir() or not run_folders(args.root):
        parser.exit(2, f"error: no runs under {args.root} (a run is a folder with event files: train one first)\n")
    with tempfile.TemporaryDirectory(prefix="capsexp-tensorboard-") as served:
        links = Path(served)
        count = link_runs(args.root, links)
        write_columns(run_folders(args.root), links / COLUMNS_RUN)
        command = [str(Path(sys.executable).with_name("tensorboard")), "--logdir", served, "--port", str(args.port)]
        server = subprocess.Popen(command)
        # Stopped (Ctrl-C, or a SIGTERM from whatever started it): the server goes too, not left orphaned.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        print(f"Serving {count} runs of {args.root} as TensorBoard runs named by what they ran: {url(args.port)}")
        try:
            while server.poll() is None:
                time.sleep(RESCAN_S)
                if new := link_runs(args.root, links):
                    write_columns(run_folders(args.root), links / COLUMNS_RUN)  # the latest summary counts
                    print(f"{new} new run{'s' if new > 1 else ''} linked")
        except KeyboardInterrupt:
            pass
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
