"""A newcomer's first hour, timed: the README's commands, in its order, in a fresh clone.

    python experiments/first_hour.py            # writes experiments/results/first_hour.md

Clones this repository's last commit into a temporary folder, gives it a data dir holding the four
plain (not gzipped) MNIST IDX files, as the README tells an offline user to, and runs there what the
README tells a new user to run: ``make install``, ``make lint``, ``make test``, the first run, the
short runs of "More runs", ``capsexp.compare`` on one of them and a mistyped key. Each step must end as
the README says (exit code, files written, no real-MNIST skip); the page gives each step's wall time,
and the README and docs quote their times from it (checked by tests/test_docs.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gzip
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from capsexp.records.events import last_scalar
from capsexp.records.machine import cpu_name
from capsexp.records.metric_names import TEST_ACC
from capsexp.results.compare import PAGE
from timing import Stopwatch

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the checkout (experiments/ run only there)

MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
RUN_FOLDER = re.compile(r"Run folder: (logs/\S+)")
MISTAKES = {
    "a mistyped group option": "model=capsnett",
    "a mistyped key": "trainer.max_epoch=1",
    "a value out of range": "data.batch_size=0",
}
PYTEST_SUMMARY = re.compile(r"=+ (.*\bpassed\b.*) in ([\d.]+)s")


def duration_text(seconds: float) -> str:
    """How the page writes a time, and so how the README and docs quote it: "under 1 s", seconds below
    90 s, else minutes."""
    if seconds < 1:
        return "under 1 s"
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


@dataclasses.dataclass
class Step:
    name: str
    command: str
    seconds: float
    result: str


def plain_mnist(source: Path, target: Path) -> None:
    """``target/MNIST/raw/`` with the four IDX files uncompressed, from ``source`` (plain or .gz files)."""
    raw = target / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in MNIST_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, raw / name)
        elif (source / f"{name}.gz").is_file():
            with gzip.open(source / f"{name}.gz") as packed, open(raw / name, "wb") as plain:
                shutil.copyfileobj(packed, plain)
        else:
            sys.exit(f"first_hour: {source} holds neither {name} nor {name}.gz (the official MNIST files)")


class Clone:
    """The fresh clone, and the README's commands run in it with the README's environment."""

    def __init__(self, folder: Path, data_dir: Path) -> None:
        self.folder = folder
        venv_bin = folder / ".venv" / "bin"
        self.env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        # `source .venv/bin/activate`, as the README says, is PATH and VIRTUAL_ENV.
        self.env.update(
            CAPSEXP_DATA_DIR=str(data_dir),
            VIRTUAL_ENV=str(folder / ".venv"),
            PATH=f"{venv_bin}{os.pathsep}{os.environ['PATH']}",
        )
        self.steps: list[Step] = []

    def run(self, name: str, command: str, expect_exit: int = 0) -> str:
        print(f"first_hour: {command}", flush=True)
        with Stopwatch() as watch:
            done = subprocess.run(command, shell=True, cwd=self.folder, env=self.env, capture_output=True, text=True)
        output = done.stdout + done.stderr
        if done.returncode != expect_exit:
            sys.exit(
                f"first_hour: `{command}` exited {done.returncode}, the README expects {expect_exit}; "
                f"its last lines:\n" + "\n".join(output.splitlines()[-30:])
            )
        self.steps.append(Step(name, command, watch.seconds, ""))
        return output

    def note(self, result: str) -> None:
        self.steps[-1].result = result


def run_folder(output: str) -> str:
    """The run's folder, from the last "Run folder:" line a run prints."""
    found = RUN_FOLDER.findall(output)
    if not found:
        sys.exit("first_hour: the run printed no 'Run folder:' line")
    return found[-1]


def first_hour(clone: Clone) -> None:
    clone.run("install", "make install")
    clone.run("lint", "make lint")

    output = clone.run("test", 'make test ARGS="-rs"')  # -rs: pytest lists what it skipped, and why
    summary = PYTEST_SUMMARY.search(output)
    if summary is None:
        sys.exit("first_hour: make test printed no pytest summary line")
    skips = [line for line in output.splitlines() if line.startswith("SKIPPED")]
    if any("MNIST" in line for line in skips):
        sys.exit("first_hour: make test skipped a real-MNIST test with the four plain IDX files:\n" + "\n".join(skips))
    clone.note(
        f"{summary.group(1)}; pytest's own time {duration_text(float(summary.group(2)))}; "
        f"skipped: {'; '.join(s.split(': ', 1)[-1] for s in skips) or 'none'}"
    )

    output = clone.run("first run", "python -m capsexp model=lenet5 data=mnist trainer.max_epochs=1")
    clone.note(f"test/acc {100 * last_scalar(clone.folder / run_folder(output), TEST_ACC):.2f}%")

    for model in ("capsnet", "lenet5"):
        output = clone.run(f"{model} debug=fast", f"python -m capsexp model={model} debug=fast")
        folder = clone.folder / run_folder(output)
        checkpoints = sorted(p.name for p in (folder / "checkpoints").glob("*.ckpt"))
        events = list(folder.rglob("events.out.tfevents.*"))
        if not checkpoints or not events:
            sys.exit(f"first_hour: debug=fast left no checkpoint or no event file in {folder}")
        clone.note(f"test/acc {100 * last_scalar(folder, TEST_ACC):.2f}% on 2 batches; {', '.join(checkpoints)}")
        if model == "capsnet":
            capsnet_run = run_folder(output)

    clone.run("compare", f"python -m capsexp.compare {capsnet_run}")
    if not (clone.folder / capsnet_run / PAGE).is_file():
        sys.exit(f"first_hour: capsexp.compare wrote no {PAGE} in {capsnet_run}")
    clone.note(f"wrote its page, {PAGE}, in the run's folder")

    # docs/running.md: a mistake stops the run with a few lines, before any data or model is loaded.
    for name, mistake in MISTAKES.items():
        output = clone.run(name, f"python -m capsexp {mistake}", expect_exit=2)
        lines = output.strip().splitlines()
        if len(lines) > 12 or "Traceback" in output:
            sys.exit(f"first_hour: {mistake} printed more than 12 lines or a traceback:\n{output}")
        clone.note(f"exit 2, {len(lines)} lines: {' '.join(lines)}")


def page(record: dict) -> str:
    """The page, from the record a run keeps beside it (``first_hour.json``)."""
    steps = [Step(**step) for step in record["steps"]]
    rows = "\n".join(
        f"| {s.name} | `{s.command}` | {duration_text(s.seconds)} | {s.result.replace('|', '&#124;')} |" for s in steps
    )
    return f"""# A newcomer's first hour

Written by `experiments/first_hour.py` on {record["date"]}: {record["machine"]}.
The code revision it cloned is in `first_hour.json` beside this page.

A fresh clone of the repository, with `CAPSEXP_DATA_DIR` a folder whose `MNIST/raw/` holds the four plain
IDX files, runs the README's commands in its order. Each time is the step's wall time, start-up included;
the machine is shared, so a busy one takes longer.

| step | command | time | result |
| --- | --- | ---: | --- |
{rows}

Run again: `python experiments/first_hour.py` (about {duration_text(sum(s.seconds for s in steps))}); this page
from its record: `python experiments/first_hour.py --report`.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mnist",
        type=Path,
        default=Path(os.environ.get("CAPSEXP_DATA_DIR", PROJECT_ROOT / "data")) / "MNIST" / "raw",
        help="a folder with the official MNIST files, plain or .gz (default: $CAPSEXP_DATA_DIR/MNIST/raw)",
    )
    parser.add_argument("--output", type=Path, default=PROJECT_ROOT / "experiments" / "results" / "first_hour.md")
    parser.add_argument("--report", action="store_true", help="write the page from its record, without running")
    args = parser.parse_args()
    record_file = args.output.with_suffix(".json")
    if args.report:
        args.output.write_text(page(json.loads(record_file.read_text())))
        print(f"first_hour: wrote {args.output}")
        return
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="capsexp-first-hour-") as tmp:
        plain_mnist(args.mnist, Path(tmp) / "data")
        subprocess.run(["git", "clone", "--quiet", str(PROJECT_ROOT), f"{tmp}/capsexp"], check=True)
        clone = Clone(Path(tmp) / "capsexp", Path(tmp) / "data")
        first_hour(clone)
    record = {
        "date": str(datetime.date.today()),
        "machine": f"{cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "revision": commit,
        "steps": [dataclasses.asdict(step) for step in clone.steps],
    }
    record_file.write_text(json.dumps(record, indent=1) + "\n")
    args.output.write_text(page(record))
    print(f"first_hour: wrote {args.output}")


if __name__ == "__main__":
    main()
