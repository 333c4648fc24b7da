"""Mutation testing (mutmut) of the whole package, by area; writes experiments/results/mutation.md.

mutmut changes the code one small edit at a time (an operator, a constant, an argument) and runs
the tests that reach the edited function: a mutant the tests let pass is a bug they would let
pass. What is mutated and which tests run is set in ``[tool.mutmut]`` of pyproject.toml; the areas
(package prefixes) are ``AREAS`` below. A surviving mutant is either killed by a better test or
listed in experiments/mutation_equivalents.yaml with the reason it cannot change a result (an
equivalent mutant); the page lists the rest as unexplained.

    python experiments/mutation.py              # every mutant not run yet (resumes where it stopped), then the page
    python experiments/mutation.py --area models lit    # these areas' mutants, all of them again
    python experiments/mutation.py --only 'capsexp.nn.functional._em_caps.x_em_routing*'  # by name (fnmatch)
    python experiments/mutation.py --report     # the page from the last run's results (mutants/)
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import re
import subprocess
import sys

import yaml

from benchlib import cpu_name
from capsexp import PROJECT_ROOT
from timing import Stopwatch

sys.path.insert(0, str(PROJECT_ROOT))
from tests.helpers import real_data_dir  # one home for where the real datasets are

RESULTS = PROJECT_ROOT / "experiments" / "results" / "mutation.md"
EQUIVALENTS = PROJECT_ROOT / "experiments" / "mutation_equivalents.yaml"
MUTMUT = [sys.executable, "-m", "mutmut"]
# Area (a package prefix; a module belongs to the longest that names it) -> what it is, in the
# page's order. `--area NAME` runs one area's mutants.
AREAS = {
    "capsexp.nn.functional": "capsule ops (squash, routing, losses)",
    "capsexp.nn": "capsule layers",
    "capsexp.models": "model wiring",
    "capsexp.lit.classifier": "Classifier metrics and reductions",
    "capsexp.lit": "objectives, margin ramp, schedulers",
    "capsexp.data.resumable": "samplers and loaders",
    "capsexp.data": "datasets, data modes, file formats",
    "capsexp.callbacks": "callbacks (timing, images, routing diagnostics, checkpoints)",
    "capsexp.attacks": "adversarial attacks",
    "capsexp.run.checkpoints": "checkpoint loading",
    "capsexp.run": "training, testing, resume, run folders, cluster jobs",
    "capsexp.results": "metric names, event files, comparison summaries",
    "capsexp.config": "config checks and the command line",
    "capsexp": "entry points and errors",
}
COUNTED = ("killed", "timeout", "survived", "no tests", "suspicious", "segfault")
NOT_RUN = "not checked"  # mutmut's status of a mutant it has not run yet


def area_of(name: str) -> str:
    """The area of a module or of a mutant (``capsexp.data.mnist.x_load__mutmut_3``)."""
    return max((prefix for prefix in AREAS if name == prefix or name.startswith(prefix + ".")), key=len)


def modules() -> list[str]:
    """Every module of the package, by its dotted name."""
    source = PROJECT_ROOT / "src"
    return sorted(
        ".".join(path.relative_to(source).with_suffix("").parts).removesuffix(".__init__")
        for path in (source / "capsexp").rglob("*.py")
    )


def area_patterns(area: str) -> list[str]:
    """mutmut's name patterns for the mutants of one area."""
    prefix = area if area.startswith("capsexp") else f"capsexp.{area}"
    if prefix not in AREAS:
        names = ", ".join(map(short, AREAS))
        sys.exit(f"--area {area}: no such area; the areas are: {names}")
    return [f"{module}.x*" for module in modules() if area_of(module) == prefix]


def results() -> dict[str, str]:
    """``{mutant name: status}`` of the last ``mutmut run``."""
    listing = subprocess.run([*MUTMUT, "results", "--all", "true"], cwd=PROJECT_ROOT, capture_output=True, text=True)
    if listing.returncode != 0:
        sys.exit(f"mutmut results failed:\n{listing.stderr.strip()}")
    found = re.findall(r"^\s+(\S+): (.+)$", listing.stdout, flags=re.MULTILINE)
    if not found:
        sys.exit("no mutation results: run `python experiments/mutation.py` (mutmut run) first")
    return dict(found)


def changed_lines(mutant: str) -> tuple[list[str], list[str]]:
    """The lines the mutant removes and those it adds (from ``mutmut show``), stripped."""
    diff = subprocess.run([*MUTMUT, "show", mutant], cwd=PROJECT_ROOT, capture_output=True, text=True).stdout
    lines = diff.splitlines()
    removed = [line[1:].strip() for line in lines if line.startswith("-") and not line.startswith("---")]
    return removed, [line[1:].strip() for line in lines if line.startswith("+") and not line.startswith("+++")]


# mutmut's string mutant "text" -> "XXtextXX".
_WRAPPED = re.compile(r"""(["'])XX((?:(?!\1).)*)XX\1""")


def wording_only(removed: list[str], added: list[str]) -> bool:
    """Whether the mutant only puts "XX" at both ends of a piece of prose (a string with a space in it:
    a message, a help text, a line of a page), which leaves what it says as it was."""
    if len(removed) != 1 or len(added) != 1:
        return False
    wrapped = _WRAPPED.search(added[0])
    return bool(wrapped and " " in wrapped[2] and _WRAPPED.sub(r"\1\2\1", added[0], count=1) == removed[0])


def load_equivalents() -> dict[str, dict[str, str]]:
    """``{mutant name: {"line": the mutated line, "reason": why it cannot change a result}}``."""
    if not EQUIVALENTS.is_file():
        return {}
    return yaml.safe_load(EQUIVALENTS.read_text()) or {}


def short(area: str) -> str:
    """An area as ``--area`` takes it."""
    return area.removeprefix("capsexp.") or "capsexp"


def page(statuses: dict[str, str], equivalents: dict[str, dict[str, str]], wall: float | None) -> str:
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    survivors: dict[str, list[tuple[str, str, str]]] = collections.defaultdict(list)  # area -> (mutant, line, reason)
    wording: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)  # area -> (mutant, line)
    stale = []
    for mutant, status in sorted(statuses.items()):
        area = area_of(mutant)
        if status in ("survived", "no tests"):
            removed, added = changed_lines(mutant)
            line = " / ".join(added)
            if status == "survived" and wording_only(removed, added):
                counts[area]["wording"] += 1
                wording[area].append((mutant, line))
                continue
            known = equivalents.get(mutant)
            if known and known.get("line", "").strip() == line:
                counts[area]["equivalent"] += 1
                survivors[area].append((mutant, line, known["reason"]))
                continue
            if known:
                stale.append(mutant)
            survivors[area].append((mutant, line, ""))
        counts[area][status] += 1
    rows = []
    for area, description in [*AREAS.items(), ("all", "the whole package")]:
        count = counts[area] if area != "all" else sum(counts.values(), collections.Counter())
        judged = sum(count[status] for status in COUNTED)
        killed = count["killed"] + count["timeout"]
        rows.append(
            f"| `{short(area)}` | {description} | {judged + count['equivalent'] + count['wording'] + count[NOT_RUN]} | "
            f"{killed} | {count['equivalent']} | {count['wording']} | {count['survived']} | {count['no tests']} | "
            f"{count[NOT_RUN]} | " + (f"{100 * killed / judged:.1f}% |" if judged else "not run |")
        )
    rows[-1] = rows[-1].replace("`all`", "**all**")
    unexplained = {area: [s for s in found if not s[2]] for area, found in survivors.items()}
    explained = {area: [s for s in found if s[2]] for area, found in survivors.items()}
    command = "python experiments/mutation.py"
    lines = [
        "# Mutation testing",
        "",
        f"Written by `{command}` (mutmut, configured in `[tool.mutmut]` of pyproject.toml) on "
        f"{datetime.date.today()}: {cpu_name()}, {os.cpu_count()} cores"
        + (f"; its last `mutmut run` took {wall / 60:.0f} min." if wall else "."),
        "Each mutant is one small edit of the code (an operator, a constant, an argument); the tests that",
        "reach the edited function run against it. Score: killed (a test failed, or the run timed out)",
        "over the mutants judged, leaving out the equivalent ones (listed with their reason in",
        "`experiments/mutation_equivalents.yaml`: edits that cannot change a result; those marked",
        '"GPU only" change a result only on a GPU, which the machine above lacks) and those not run',
        'yet, and those that only put "XX" at both ends of a piece of prose (a message, a help text, a line',
        "of a page: a string with a space in it), which leaves what it says unchanged (column wording; the",
        "tests check a message by what it says: the culprit, the allowed values). A mutant no test reaches",
        "counts as survived. The goal in every area: each mutant killed or explained.",
        "`python experiments/mutation.py --area AREA` runs one area (the first column).",
        "",
        "| area | code | mutants | killed | equivalent | wording | survived | no test reaches it | not run yet "
        "| score |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
        "",
    ]
    lines += [f"## Survivors not explained ({sum(map(len, unexplained.values()))})", ""]
    for area in AREAS:
        if unexplained.get(area):
            lines += [f"### `{short(area)}`", ""]
            lines += [f"- `{mutant}`: `{line}`" for mutant, line, _ in unexplained[area]] + [""]
    if not any(unexplained.values()):
        lines += ["None.", ""]
    if stale:
        lines += ["Listed as equivalent, but the mutant is now another edit (re-judge): ", ""]
        lines += [f"- `{mutant}`" for mutant in stale] + [""]
    lines += [f"## Equivalent mutants ({sum(map(len, explained.values()))})", ""]
    lines += ["Each with the reason it cannot change a result.", ""]
    for area in AREAS:
        if explained.get(area):
            lines += [f"### `{short(area)}`", ""]
            lines += [f"- `{mutant}`: `{line}`: {reason}" for mutant, line, reason in explained[area]] + [""]
    lines += [f"## Wording only ({sum(map(len, wording.values()))})", ""]
    for area in AREAS:
        if wording.get(area):
            lines += [f"### `{short(area)}`", ""]
            lines += [f"- `{mutant}`: `{line}`" for mutant, line in wording[area]] + [""]
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--report", action="store_true", help="write the page from the last run, without running")
    parser.add_argument("--max-children", type=int, default=os.cpu_count(), help="mutants tested at once")
    parser.add_argument(
        "--area", nargs="+", default=[], metavar="AREA", help="run only these areas' mutants (e.g. nn.functional run)"
    )
    parser.add_argument(
        "--only", nargs="+", default=[], metavar="PATTERN", help="run only the mutants whose names match (fnmatch)"
    )
    args = parser.parse_args()
    wall = None
    if not args.report:
        selected = [pattern for area in args.area for pattern in area_patterns(area)] + args.only
        run = [*MUTMUT, "run", "--max-children", str(args.max_children), *selected]
        # One thread per mutant: mutmut forks its workers from a process that has imported (and may
        # have run) torch, and a child forked after OpenMP started hangs in its first parallel region
        # (every such mutant then ends as a false timeout).
        # The tests run in mutants/, so the real datasets are not beside the checkout there.
        env = {**os.environ, "OMP_NUM_THREADS": "1", "CAPSEXP_DATA_DIR": str(real_data_dir())}
        with Stopwatch() as watch:
            subprocess.run(run, cwd=PROJECT_ROOT, check=True, env=env)
        wall = watch.seconds
    RESULTS.write_text(page(results(), load_equivalents(), wall))
    print(f"wrote {RESULTS.relative_to(PROJECT_ROOT)}")


if __name__ == "__main__":
    main()
