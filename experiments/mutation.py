"""Mutation testing (mutmut) of the code where a silent bug changes the science; writes
experiments/results/mutation.md.

mutmut changes the code one small edit at a time (an operator, a constant, an argument) and runs
the tests that reach the edited function: a mutant the tests let pass is a bug they would let
pass. What is mutated and which tests run is set in ``[tool.mutmut]`` of pyproject.toml. A
surviving mutant is either killed by a better test or listed in experiments/mutation_equivalents.yaml
with the reason it cannot change a result (an equivalent mutant); the page lists the rest as
unexplained.

    python experiments/mutation.py              # mutmut run (resumes where it stopped), then the page
    python experiments/mutation.py --only 'capsexp.nn.functional.*'    # one area's mutants (fnmatch)
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

RESULTS = PROJECT_ROOT / "experiments" / "results" / "mutation.md"
EQUIVALENTS = PROJECT_ROOT / "experiments" / "mutation_equivalents.yaml"
MUTMUT = [sys.executable, "-m", "mutmut"]
# Module prefix -> what it is, in the page's order.
AREAS = {
    "capsexp.nn.functional": "capsule ops (squash, routing, losses)",
    "capsexp.lit.classifier": "Classifier metrics and reductions",
    "capsexp.data.resumable": "samplers and loaders",
    "capsexp.run.checkpoints": "checkpoint loading",
}
COUNTED = ("killed", "timeout", "survived", "no tests", "suspicious", "segfault")
NOT_RUN = "not checked"  # mutmut's status of a mutant it has not run yet
TARGET_SCORE = 0.9  # on the capsule ops and the metric reductions


def area_of(mutant: str) -> str:
    return next((area for prefix, area in AREAS.items() if mutant.startswith(prefix + ".")), "other")


def results() -> dict[str, str]:
    """``{mutant name: status}`` of the last ``mutmut run``."""
    listing = subprocess.run([*MUTMUT, "results", "--all", "true"], cwd=PROJECT_ROOT, capture_output=True, text=True)
    if listing.returncode != 0:
        sys.exit(f"mutmut results failed:\n{listing.stderr.strip()}")
    found = re.findall(r"^\s+(\S+): (.+)$", listing.stdout, flags=re.MULTILINE)
    if not found:
        sys.exit("no mutation results: run `python experiments/mutation.py` (mutmut run) first")
    return dict(found)


def mutated_lines(mutant: str) -> list[str]:
    """The lines the mutant adds (from ``mutmut show``), stripped."""
    diff = subprocess.run([*MUTMUT, "show", mutant], cwd=PROJECT_ROOT, capture_output=True, text=True).stdout
    return [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]


def load_equivalents() -> dict[str, dict[str, str]]:
    """``{mutant name: {"line": the mutated line, "reason": why it cannot change a result}}``."""
    if not EQUIVALENTS.is_file():
        return {}
    return yaml.safe_load(EQUIVALENTS.read_text()) or {}


def page(statuses: dict[str, str], equivalents: dict[str, dict[str, str]], wall: float | None) -> str:
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    survivors: list[tuple[str, str, str]] = []  # (mutant, line, reason or "")
    stale = []
    for mutant, status in sorted(statuses.items()):
        area = area_of(mutant)
        if status in ("survived", "no tests"):
            line = " / ".join(mutated_lines(mutant))
            known = equivalents.get(mutant)
            if known and known.get("line", "").strip() == line:
                counts[area]["equivalent"] += 1
                survivors.append((mutant, line, known["reason"]))
                continue
            if known:
                stale.append(mutant)
            survivors.append((mutant, line, ""))
        counts[area][status] += 1
    rows = []
    scores = {}
    for area in [*AREAS.values(), "other"]:
        if area not in counts:
            continue
        count = counts[area]
        judged = sum(count[status] for status in COUNTED)
        killed = count["killed"] + count["timeout"]
        scores[area] = killed / judged if judged else float("nan")
        rows.append(
            f"| {area} | {judged + count['equivalent'] + count[NOT_RUN]} | {killed} | {count['equivalent']} | "
            f"{count['survived']} | {count['no tests']} | {count[NOT_RUN]} | "
            + (f"{100 * scores[area]:.1f}% |" if judged else "not run |")
        )
    unexplained = [s for s in survivors if not s[2]]
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
        "yet. A mutant no test reaches counts as survived.",
        "",
        "| code | mutants | killed | equivalent | survived | no test reaches it | not run yet | score |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
        "",
        f"Target: at least {100 * TARGET_SCORE:.0f}% on the capsule ops and the Classifier's metric reductions.",
        "",
    ]
    lines += [f"## Survivors not explained ({len(unexplained)})", ""]
    lines += [f"- `{mutant}`: `{line}`" for mutant, line, _ in unexplained] or ["None."]
    if stale:
        lines += ["", "Listed as equivalent, but the mutant is now another edit (re-judge): "]
        lines += [f"- `{mutant}`" for mutant in stale]
    lines += ["", f"## Equivalent mutants ({sum(1 for s in survivors if s[2])})", ""]
    lines += [f"- `{mutant}`: `{line}`: {reason}" for mutant, line, reason in survivors if reason] or ["None."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--report", action="store_true", help="write the page from the last run, without running")
    parser.add_argument("--max-children", type=int, default=os.cpu_count(), help="mutants tested at once")
    parser.add_argument(
        "--only", nargs="+", default=[], metavar="PATTERN", help="run only the mutants whose names match (fnmatch)"
    )
    args = parser.parse_args()
    wall = None
    if not args.report:
        run = [*MUTMUT, "run", "--max-children", str(args.max_children), *args.only]
        # One thread per mutant: mutmut forks its workers from a process that has imported (and may
        # have run) torch, and a child forked after OpenMP started hangs in its first parallel region
        # (every such mutant then ends as a false timeout).
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        with Stopwatch() as watch:
            subprocess.run(run, cwd=PROJECT_ROOT, check=True, env=env)
        wall = watch.seconds
    RESULTS.write_text(page(results(), load_equivalents(), wall))
    print(f"wrote {RESULTS.relative_to(PROJECT_ROOT)}")


if __name__ == "__main__":
    main()
