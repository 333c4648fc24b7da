"""Serve runs in TensorBoard so that its first view answers "which is better":
``python -m capsexp.tensorboard [logs] [--port 6006]`` (``make tensorboard``).

TensorBoard names a run by its path under the folder it serves, ``train/multiruns/<time>/<job>``, and
its run list cuts names at about 45 characters: before the part that differs. Each run is served here
under a short name that starts with what it ran (the job's overrides, then its day and time), through a
folder of links that is kept up to date while the server runs, so runs started later appear too.

The URL printed pins the accuracy curves at the top of the Time Series tab. The HParams tab takes its
columns from one experiment summary: a run of links holds one made from every run's choices (each run
writes only its own session), so that choices made by some runs only (``model/routing``, ``data/root``)
are columns too.
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
from pathlib import Path

from capsexp.locations import PROJECT_ROOT
from capsexp.results.events import load_events
from capsexp.results.metric_names import PLAIN, PRESENCE_GAP, TEST_ACC, VAL_ACC, VAL_ACC_BEST
from capsexp.run.hparams import LEADING_COLUMNS, metric_names

EVENTS = "events.out.tfevents.*"
PINNED = (VAL_ACC, VAL_ACC_BEST, TEST_ACC)  # the cards the URL pins, in this order
COLUMNS_RUN = "(hparams columns)"  # the run that holds the experiment summary; "(" sorts before names
RESCAN_S = 30  # how often new runs are linked while serving
_UNSAFE = re.compile(r"[^\w=.,+@%~() -]")


def run_folders(root: Path) -> list[Path]:
    """Folders under ``root`` holding event files, in path order (a run's checkpoints hold none)."""
    return sorted({path.parent for path in root.rglob(EVENTS)})


def short_name(folder: Path, root: Path) -> str:
    """What the run ran first, then when: ``model=capsnet,seed=1 (11-27 20-48)`` for a multirun's job
    ``multiruns/2026-11-27_20-48-08-501234/model=capsnet,seed=1``, ``model=lenet5 (11-27 20-48-08)`` for
    the single run ``runs/2026-11-27_20-48-08-501234_model=lenet5``; other layouts keep their path."""
    parts = folder.relative_to(root).parts
    stamp = re.compile(r"^\d{4}-(\d\d-\d\d)_(\d\d-\d\d-\d\d)(?:-\d+)?(?:_(.*))?$")  # conf/hydra/default.yaml's
    for index, part in enumerate(parts):
        found = stamp.match(part)
        if not found:
            continue
        day, clock, single = found.groups()
        rest = "/".join(parts[index + 1 :])
        what = rest or single or ""
        when = f"{day} {clock[:5] if rest else clock}"
        return _UNSAFE.sub("_", f"{what} ({when})" if what else when)
    return _UNSAFE.sub("_", "/".join(parts).replace("/", " ")) or "."


def link_runs(root: Path, links: Path) -> int:
    """Link every run under ``root`` into ``links`` by its :func:`short_name` (numbered where two share
    one); return how many new links were made."""
    present = {os.readlink(link) for link in links.iterdir() if link.is_symlink()}
    made = 0
    for folder in run_folders(root):
        if str(folder.resolve()) in present:
            continue
        name, number = short_name(folder, root), 2
        while (links / name).exists() or (links / name).is_symlink():
            name, number = f"{short_name(folder, root)} #{number}", number + 1
        (links / name).symlink_to(folder.resolve(), target_is_directory=True)
        made += 1
    return made


def write_columns(folders: list[Path], target: Path) -> None:
    """An HParams experiment summary into ``target``: every hyperparameter any run's session names
    (the first value seen sets its type), the run's leading choices first, then by name; and as metrics
    :func:`~capsexp.run.hparams.metric_names` of every test set and score any run logged."""
    from tensorboard.plugins.hparams import metadata
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams as hparams_summary

    hyperparameters: dict = {}
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
        for name, value in metadata.parse_session_start_info_plugin_data(session).hparams.items():
            kind = value.WhichOneof("kind")
            hyperparameters.setdefault(name, getattr(value, kind))
    if not hyperparameters:
        return
    test_sets = [PLAIN, *sorted(tag.removeprefix(f"{TEST_ACC}_") for tag in logged if tag.startswith(f"{TEST_ACC}_"))]
    metrics = {name: 0.0 for name in metric_names(test_sets, presence=PRESENCE_GAP in logged) if name in logged}
    leading = [name for name in LEADING_COLUMNS if name in hyperparameters]
    ordered = {name: hyperparameters[name] for name in [*leading, *sorted(set(hyperparameters) - set(leading))]}
    experiment, _, _ = hparams_summary(ordered, metrics)
    with SummaryWriter(str(target)) as writer:
        writer._get_file_writer().add_summary(experiment)


def url(port: int) -> str:
    """TensorBoard's address with the accuracy cards pinned at the top of its Time Series tab."""
    pinned = json.dumps([{"plugin": "scalars", "tag": tag} for tag in PINNED], separators=(",", ":"))
    return f"http://localhost:{port}/?pinnedCards={urllib.parse.quote(pinned)}#timeseries"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m capsexp.tensorboard", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("root", nargs="?", type=Path, default=PROJECT_ROOT / "logs", help="the runs' folder (logs/)")
    parser.add_argument("--port", type=int, default=6006)
    args = parser.parse_args(argv)
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
