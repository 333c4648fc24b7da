"""Planted flips: each either/or of ``experiments/mutation_flips.yaml`` taken the other way in a scratch
copy of the code, against the tests it names; the block of ``experiments/results/mutation.md`` between
its flips markers says which were caught, and by which test.

    python experiments/flips.py               # this tree's tests
    python experiments/flips.py --before REV  # and, beside them, the tests as they were at git revision REV
    python experiments/flips.py --only 'src/capsexp/use/*'   # the flips in these files alone, the rest kept
    python experiments/flips.py --again       # the flips this tree's tests did not catch, again
    python experiments/flips.py --report      # the page from the kept verdicts

The verdicts are kept in ``experiments/results/flips.json``, per flip while it is unchanged: a run judges the
flips it selects and keeps every other verdict, an earlier revision's column included.

A flip is caught when its tests fail with it and pass without it (each copy is checked unflipped first).
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import yaml

from capsexp.records.machine import cpu_name
from timing import Stopwatch

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the checkout (experiments/ run only there)

FLIPS = PROJECT_ROOT / "experiments" / "mutation_flips.yaml"
PAGE = PROJECT_ROOT / "experiments" / "results" / "mutation.md"
VERDICTS = PROJECT_ROOT / "experiments" / "results" / "flips.json"  # each column's verdicts, kept between runs
BEGIN, END = "<!-- flips -->", "<!-- /flips -->"
THIS_TREE = "this tree's tests"
COPIED = ("src", "conf", "tests", "pyproject.toml", "README.md", "docs", "experiments")
FAILED = re.compile(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", re.MULTILINE)  # a test id may hold spaces


def scratch_copy(folder: Path, tests_from: str | None) -> None:
    """The code and configs of this tree in ``folder``; the tests of ``tests_from`` (a git revision) if given."""
    for name in COPIED:
        source = PROJECT_ROOT / name
        if source.is_dir():
            # The results pages' kept runs are left out: no flip's tests rebuild a page.
            shutil.copytree(source, folder / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "runs"))
        else:
            shutil.copy(source, folder / name)
    if tests_from:
        shutil.rmtree(folder / "tests")
        archive = subprocess.run(
            ["git", "archive", tests_from, "tests"], cwd=PROJECT_ROOT, capture_output=True, check=True
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(folder, filter="data")


def pytest(folder: Path, tests: list[str], first_failure: bool = False) -> subprocess.CompletedProcess:
    """The tests in the copy; ``first_failure``: stop at the first that fails (it names the verdict)."""
    # The copy's package first on the path (before the editable install of this tree), one thread each.
    env = {**os.environ, "PYTHONPATH": str(folder / "src"), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "-m", "not slow", *tests]
    return subprocess.run(
        [*command, *(["-x"] if first_failure else [])], cwd=folder, env=env, capture_output=True, text=True
    )


# Whether a set of test files passes on the unflipped copy, asked once per set: every flip restores the copy.
_PASSES_UNFLIPPED: dict[tuple[Path, tuple[str, ...]], bool] = {}


def passes_unflipped(folder: Path, tests: list[str]) -> bool:
    key = (folder, tuple(tests))
    if key not in _PASSES_UNFLIPPED:
        _PASSES_UNFLIPPED[key] = pytest(folder, tests).returncode == 0
    return _PASSES_UNFLIPPED[key]


def flip(folder: Path, entry: dict) -> str:
    """What the flip's tests say: the first test that failed, "survived", or why it could not be judged."""
    tests = [t for t in entry["tests"] if (folder / t).exists()]
    if not tests:
        return "no test (none of its test files exist)"
    path = folder / entry["file"]
    original = path.read_text()
    if entry["old"] not in original:
        raise SystemExit(f"flips: {entry['file']} no longer holds {entry['old']!r}: update {FLIPS.name}")
    if not passes_unflipped(folder, tests):
        return "not judged: its tests fail without the flip"
    path.write_text(original.replace(entry["old"], entry["new"], 1))
    try:
        result = pytest(folder, tests, first_failure=True)
    finally:
        path.write_text(original)
    if result.returncode == 0:
        return "survived"
    failed = FAILED.findall(result.stdout)
    return f"caught by `{failed[0]}`" if failed else "caught (the tests did not run)"


def block(columns: dict[str, dict[str, str]], whats: list[str], commands: list[str], seconds: float) -> str:
    header = " | ".join(columns)
    rows = "\n".join(
        f"| {what} | " + " | ".join(v.get(what, "not judged") for v in columns.values()) + " |" for what in whats
    )

    def judged(verdicts: dict[str, str]) -> list[str]:
        return [verdicts[what] for what in whats if what in verdicts and not verdicts[what].startswith("not judged")]

    totals = "; ".join(
        f"with {name}, {sum(v.startswith('caught') for v in judged(verdicts))} of the {len(judged(verdicts))} "
        f"flips they judged caught"
        for name, verdicts in columns.items()
    )
    run = ", ".join(f"`{command}`" for command in commands)
    return f"""{BEGIN}
## Planted flips

Written by {run} on {datetime.date.today()}: {cpu_name()}, {os.cpu_count()} cores,
{seconds / 60:.1f} min of judging. Where the code picks one of two things (the best checkpoint or the last, training
or evaluation batches, seed 0 or none, rank zero or the others), passes an option down, or reads a path, a batch,
a group or the second of several, the other side taken in a scratch copy of the code, against the tests a change
there runs (`experiments/mutation_flips.yaml`). Each verdict is kept from the last of these runs that judged its
flip. **{totals[0].upper()}{totals[1:]}.**

| flip | {header} |
| --- |{" --- |" * len(columns)}
{rows}
{END}"""


def judge_all(entries: list[dict], tests_from: str | None) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="capsexp-flips-") as tmp:
        scratch_copy(Path(tmp), tests_from)
        verdicts = []
        for entry in entries:
            verdicts.append(flip(Path(tmp), entry))
            print(f"flips ({tests_from or 'this tree'}): {entry['what']}: {verdicts[-1]}", flush=True)
    return verdicts


def _key(entry: dict) -> str:
    """A flip as its verdicts are kept: a changed flip (its file, text or tests) is judged again."""
    return json.dumps([entry["file"], entry["old"], entry["new"], entry["tests"]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="a git revision whose tests to judge the flips with too, beside this tree's")
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="PATTERN",
        help="judge only the flips whose file matches one of these (fnmatch, e.g. 'src/capsexp/use/*'), keeping "
        "the other verdicts",
    )
    parser.add_argument(
        "--again",
        action="store_true",
        help="judge again only the flips this tree's tests let survive or could not judge (after fixing those "
        "tests), keeping the other verdicts",
    )
    parser.add_argument("--report", action="store_true", help="the page from the kept verdicts, judging nothing")
    args = parser.parse_args()
    entries = yaml.safe_load(FLIPS.read_text())
    whats = [e["what"] for e in entries]
    kept = json.loads(VERDICTS.read_text()) if VERDICTS.exists() else {}
    # Verdicts are kept per flip while the flip is the same one (a column's tests do not change).
    columns: dict[str, dict[str, str]] = {
        name: {e["what"]: v[_key(e)] for e in entries if _key(e) in v} for name, v in kept.get("columns", {}).items()
    }
    selected = [e for e in entries if not args.only or any(fnmatch.fnmatch(e["file"], p) for p in args.only)]
    selected = [] if args.report else selected
    with Stopwatch() as watch:
        if args.before:
            name = f"the tests of {args.before}"
            judged = judge_all(selected, args.before)
            columns[name] = {**columns.get(name, {}), **dict(zip([e["what"] for e in selected], judged, strict=True))}
        ours = columns.get(THIS_TREE, {})
        if args.again:
            selected = [e for e in selected if not ours.get(e["what"], "").startswith("caught")]
        judged = judge_all(selected, None)
        columns[THIS_TREE] = {**ours, **dict(zip([e["what"] for e in selected], judged, strict=True))}
    columns = {name: columns[name] for name in sorted(columns, key=lambda n: n == THIS_TREE)}  # ours last
    seconds = kept.get("seconds", 0.0) + watch.seconds
    command = shlex.join(["python", "experiments/flips.py", *sys.argv[1:]])
    commands = list(dict.fromkeys([*kept.get("commands", []), *([] if args.report else [command])]))
    by_key = {name: {_key(e): v[e["what"]] for e in entries if e["what"] in v} for name, v in columns.items()}
    VERDICTS.write_text(json.dumps({"columns": by_key, "commands": commands, "seconds": seconds}, indent=1) + "\n")
    new = block(columns, whats, commands, seconds)
    text = PAGE.read_text()
    if BEGIN in text:
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: new, text, flags=re.S)
    else:
        text = f"{text.rstrip()}\n\n{new}\n"
    PAGE.write_text(text)
    print(f"flips: wrote {PAGE.relative_to(PROJECT_ROOT)} and {VERDICTS.relative_to(PROJECT_ROOT)}")


if __name__ == "__main__":
    main()
