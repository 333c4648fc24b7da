"""Mutation testing (mutmut) of the whole package, by area; writes experiments/results/mutation.md.

mutmut changes the code one small edit at a time (an operator, a constant, an argument) and runs
the tests that reach the edited function: a mutant the tests let pass is a bug they would let
pass. What is mutated and which tests run is set in ``[tool.mutmut]`` of pyproject.toml; the areas
(package prefixes) are ``AREAS`` below. A surviving mutant is either killed by a better test or
listed in experiments/mutation_equivalents.yaml with the reason it cannot change a result (an
equivalent mutant), or recognised as wording or device only (``KINDS``); the page lists the rest as
unexplained.

    python experiments/mutation.py --sample     # 50 mutants of each area (seeded; make mutate), then the page
    python experiments/mutation.py --survivors  # every survivor not explained, again (after new tests)
    python experiments/mutation.py              # every mutant not run yet (resumes where it stopped): hours
    python experiments/mutation.py --area models lit    # these areas' mutants, all of them again
    python experiments/mutation.py --only 'capsexp.nn.functional._em_routing.x_em_routing*'  # by name (fnmatch)
    python experiments/mutation.py --report     # the page from the last run's results (mutants/)
"""

from __future__ import annotations

import argparse
import ast
import collections
import datetime
import fnmatch
import functools
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import scipy.stats
import yaml
from mutmut.__main__ import walk_mutatable_files
from mutmut.mutation.data import SourceFileMutationData
from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code

from capsexp.records.machine import cpu_name
from flips import BEGIN as FLIPS_BEGIN
from flips import END as FLIPS_END
from timing import Stopwatch

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the checkout (experiments/ run only there)

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
    "capsexp.records.checkpoints": "checkpoint loading",
    "capsexp.run": "training, testing, resume, run folders, cluster jobs",
    "capsexp.results": "metric names, event files, comparison summaries",
    "capsexp.config": "config checks and the command line",
    "capsexp": "entry points and errors",
}
COUNTED = ("killed", "timeout", "survived", "no tests", "suspicious", "segfault")
# Where the last ``--sample`` is kept, and the seed of every sample.
SAMPLE_FILE = PROJECT_ROOT / "mutants" / "capsexp-sample.json"
SAMPLE_SEED = 0
SAMPLE_PER_AREA = 50  # --sample without a number (make mutate): 95% intervals of about +-10 points
NOT_RUN = "not checked"  # mutmut's status of a mutant it has not run yet
INTERRUPTED = "check was interrupted by user"  # stopped mid-test: not run either


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


def sample(names: list[str], per_area: int) -> set[str]:
    """A uniform random sample of ``per_area`` mutants of each area (all of an area with fewer), seeded
    by ``SAMPLE_SEED``: the same mutants on every machine while the code stays as it is."""
    by_area = collections.defaultdict(list)
    for name in sorted(names):
        by_area[area_of(name)].append(name)
    rng = random.Random(SAMPLE_SEED)
    return {name for area in sorted(by_area) for name in rng.sample(by_area[area], min(per_area, len(by_area[area])))}


def sample_size() -> int | None:
    """The ``--sample`` of the last run that sampled (kept in mutants/, beside mutmut's results)."""
    return json.loads(SAMPLE_FILE.read_text())["per_area"] if SAMPLE_FILE.is_file() else None


def _mutation_data() -> dict[str, SourceFileMutationData]:
    """``{mutant name: its file's mutation data}`` of the last ``mutmut run``, read in this process
    (``mutmut show`` per mutant costs a second of start-up each)."""
    os.chdir(PROJECT_ROOT)  # mutmut reads its configuration and mutants/ from the working directory
    found = {}
    for path in walk_mutatable_files():
        data = SourceFileMutationData(path=path)
        data.load()
        found.update(dict.fromkeys(data.exit_code_by_key, data))
    if not found:
        sys.exit("no mutation results: run `python experiments/mutation.py` (mutmut run) first")
    return found


def results() -> dict[str, str]:
    """``{mutant name: status}`` of the last ``mutmut run``, read afresh (the diffs then read the same)."""
    _mutation_data_cached.cache_clear()
    data_by_name = _mutation_data_cached()
    statuses = {name: status_by_exit_code[data.exit_code_by_key[name]] for name, data in data_by_name.items()}
    return {name: NOT_RUN if status == INTERRUPTED else status for name, status in statuses.items()}


_mutation_data_cached = functools.cache(_mutation_data)


def changed_lines(mutant: str) -> tuple[list[str], list[str]]:
    """The lines the mutant removes and those it adds, stripped."""
    lines = get_diff_for_mutant(mutant, path=_mutation_data_cached()[mutant].path).splitlines()
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


def _parsed(line: str) -> ast.Module | None:
    """A changed line parsed on its own (a ``with``/``if`` header or an argument line completed)."""
    for text in (line, line + " pass", f"({line.rstrip(',')})", f"f({line}"):  # f(: the end of a call
        try:
            return ast.parse(text)
        except SyntaxError:
            continue
    return None


def _always_none(node: ast.expr) -> bool:
    """``None``, or mutmut's ``A if (...) and False else None``."""
    if isinstance(node, ast.IfExp):
        test = node.test
        last = test.values[-1] if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else None
        return isinstance(last, ast.Constant) and last.value is False and _always_none(node.orelse)
    return isinstance(node, ast.Constant) and node.value is None


class _WithoutPlacement(ast.NodeTransformer):
    """Drops the device a tensor is made on or moved to: every ``device=`` argument, and every argument
    that is ``None`` or names a device (``.to(images.device)``, ``pools_on(specs.device)``), keeping
    the dropped devices in ``devices``."""

    def __init__(self) -> None:
        self.devices: list[str] = []

    def _placement(self, node: ast.expr) -> bool:
        if _always_none(node) or "device" in ast.unparse(node):
            self.devices.append("None" if _always_none(node) else ast.unparse(node))
            return True
        return False

    def visit_Assign(self, node: ast.Assign) -> ast.AST:  # device = labels.device
        self.generic_visit(node)
        if self._placement(node.value):
            node.value = ast.Constant("a device")
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        for keyword in [k for k in node.keywords if k.arg == "device"]:  # whatever it is: recorded
            self.devices.append("None" if _always_none(keyword.value) else ast.unparse(keyword.value))
        node.keywords = [k for k in node.keywords if not (k.arg == "device" or self._placement(k.value))]
        node.args = [arg for arg in node.args if not self._placement(arg)]
        moved = isinstance(node.func, ast.Attribute) and node.func.attr == "to"
        return node.func.value if moved and not node.args and not node.keywords else node


def device_only(removed: list[str], added: list[str]) -> bool:
    """Whether the mutant only puts a tensor on the default device (the CPU) where the code names
    another: the same result on a machine without an accelerator."""
    if len(removed) != 1 or len(added) != 1:
        return False
    trees = _parsed(removed[0]), _parsed(added[0])
    if None in trees:
        return False
    original, mutant = _WithoutPlacement(), _WithoutPlacement()
    same_otherwise = ast.dump(original.visit(trees[0])) == ast.dump(mutant.visit(trees[1]))
    return same_otherwise and all(device == "None" or device in original.devices for device in mutant.devices)


def load_equivalents() -> dict[str, dict[str, str]]:
    """``{mutant name: {"line": the mutated line, "reason": why it cannot change a result}}``."""
    if not EQUIVALENTS.is_file():
        return {}
    return yaml.safe_load(EQUIVALENTS.read_text()) or {}


def short(area: str) -> str:
    """An area as ``--area`` takes it."""
    return area.removeprefix("capsexp.") or "capsexp"


# Survivors recognised by what they change, each kind a column and a list of its own:
# kind -> (column, test of the removed and added lines).
KINDS = {"wording": ("wording", wording_only), "device": ("device only", device_only)}


def judge(mutant: str, status: str, equivalents: dict[str, dict[str, str]]) -> tuple[str, str]:
    """``(verdict, the line the mutant writes)``: a survivor recognised by its kind (``KINDS``) or listed
    as equivalent gets that verdict; every other mutant keeps its status (the line then only for
    survivors)."""
    if status not in ("survived", "no tests"):
        return status, ""
    removed, added = changed_lines(mutant)
    line = " / ".join(added)
    kind = next((kind for kind, (_, test) in KINDS.items() if test(removed, added)), None)
    if status == "survived" and kind:
        return kind, line
    if mutant in equivalents and equivalents[mutant].get("line", "").strip() == line:
        return "equivalent", line
    return status, line


def unexplained(statuses: dict[str, str], equivalents: dict[str, dict[str, str]]) -> list[str]:
    """The survivors neither recognised by their kind nor listed as equivalent."""
    return [m for m, status in statuses.items() if judge(m, status, equivalents)[0] in ("survived", "no tests")]


def score(killed: int, judged: int, sampled: bool) -> str:
    """Killed over judged; from a sample, with its 95% (Wilson) interval."""
    if not judged:
        return "not run"
    if not sampled:
        return f"{100 * killed / judged:.1f}%"
    low, high = scipy.stats.binomtest(killed, judged).proportion_ci(0.95, method="wilson")
    return f"{100 * killed / judged:.0f}% ({100 * low:.0f}-{100 * high:.0f}%)"


def page(
    statuses: dict[str, str], equivalents: dict[str, dict[str, str]], wall: float | None, sampled: set[str] | None
) -> str:
    verdicts: dict[str, str] = {}  # mutant -> its status, or the kind of survivor it was recognised as
    survivors: dict[str, list[tuple[str, str, str]]] = collections.defaultdict(list)  # area -> (mutant, line, reason)
    # kind -> area -> (mutant, line)
    recognised: dict[str, dict[str, list[tuple[str, str]]]] = {kind: collections.defaultdict(list) for kind in KINDS}
    stale = []
    for mutant, status in sorted(statuses.items()):
        area = area_of(mutant)
        verdicts[mutant], line = judge(mutant, status, equivalents)
        if verdicts[mutant] in KINDS:
            recognised[verdicts[mutant]][area].append((mutant, line))
        elif verdicts[mutant] == "equivalent":
            survivors[area].append((mutant, line, equivalents[mutant]["reason"]))
        elif line:
            stale += [mutant] if mutant in equivalents else []
            survivors[area].append((mutant, line, ""))
    # An area run whole is counted whole; one that is not, by its sample.
    unfinished = {area_of(mutant) for mutant, status in statuses.items() if status == NOT_RUN}
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for mutant, verdict in verdicts.items():
        area = area_of(mutant)
        if area not in unfinished or sampled is None or mutant in sampled:
            counts[area][verdict] += 1
    totals = collections.Counter(area_of(mutant) for mutant in statuses)
    rows = []
    for area, description in AREAS.items():
        count = counts[area]
        judged = sum(count[status] for status in COUNTED)
        killed = count["killed"] + count["timeout"]
        by_sample = area in unfinished and sampled is not None
        rows.append(
            f"| `{short(area)}` | {description} | {totals[area]} | "
            + (f"sample of {sum(count.values())}" if by_sample else "all" if area not in unfinished else "so far")
            + f" | {killed} | {count['equivalent']} | "
            + "".join(f"{count[kind]} | " for kind in KINDS)
            + f"{count['survived']} | {count['no tests']} | {count[NOT_RUN]} | {score(killed, judged, by_sample)} |"
        )
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
        "over the mutants judged, leaving out those not run yet and three kinds of survivors that cannot",
        "change a result here (below). An area whose every mutant has run is counted whole; one that has",
        "not, by a seeded uniform random sample of its mutants (`--sample N`, N per area), with the score's",
        "95% interval (Wilson). The survivors listed are all those found, in the sample or not.",
        "",
        "",
        "- equivalent: listed with the reason in `experiments/mutation_equivalents.yaml`; those marked",
        '  "GPU only" change a result only on a GPU, which the machine above lacks;',
        '- wording: the edit only puts "XX" at both ends of a piece of prose (a message, a help text, a',
        "  line of a page: a string with a space in it), which leaves what it says unchanged (the tests",
        "  check a message by what it says: the culprit, the allowed values);",
        "- device only: the edit only puts a tensor or a model on the default device, the CPU, where the",
        "  code names another (a `device=` argument made `None` or dropped, a `.to(device)` made",
        "  `.to(None)`): the same result on a machine without a GPU; the GPU tests",
        "  (`pytest -m gpu`) are where these are judged.",
        "",
        "A mutant no test reaches counts as survived. The goal in every area: each mutant killed or",
        "explained. `python experiments/mutation.py --area AREA` runs one area (the first column).",
        "",
        "| area | code | mutants | counted | killed | equivalent | "
        + "".join(f"{column} | " for column, _ in KINDS.values())
        + "survived | no test reaches it | not run yet | score |",
        "| --- | --- | ---: | --- | " + "---: | " * (5 + len(KINDS)) + "---: |",
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
    for kind, (column, _) in KINDS.items():
        found = recognised[kind]
        lines += [f"## {column.capitalize()} ({sum(map(len, found.values()))})", ""]
        for area in AREAS:
            if found.get(area):
                lines += [f"### `{short(area)}`", ""]
                lines += [f"- `{mutant}`: `{line}`" for mutant, line in found[area]] + [""]
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
    parser.add_argument(
        "--sample",
        type=int,
        nargs="?",
        const=SAMPLE_PER_AREA,
        metavar="N",
        help=f"run a seeded random sample of N mutants per area, those not run yet (N: {SAMPLE_PER_AREA})",
    )
    parser.add_argument(
        "--survivors", action="store_true", help="run every survivor not explained again (after new tests)"
    )
    args = parser.parse_args()
    if args.sample is not None and args.sample < 1:
        sys.exit(f"--sample {args.sample}: give the number of mutants per area, 1 or more")
    wall = None
    if not args.report:
        selected = [pattern for area in args.area for pattern in area_patterns(area)] + args.only
        if args.sample or args.survivors:
            statuses = results() if (PROJECT_ROOT / "mutants").is_dir() else {}
            if args.sample and not statuses:
                sys.exit("--sample needs the mutants listed first: run `python experiments/mutation.py --only none`")
            names = set()
            if args.sample:
                names |= {name for name in sample(list(statuses), args.sample) if statuses[name] == NOT_RUN}
                SAMPLE_FILE.write_text(json.dumps({"per_area": args.sample, "seed": SAMPLE_SEED}))
            if args.survivors:  # those not explained: an equivalent mutant survives any test
                names |= set(unexplained(statuses, load_equivalents()))
            if selected:
                names = {name for name in names if any(fnmatch.fnmatch(name, pattern) for pattern in selected)}
            selected = sorted(names)
            if not selected:
                print("nothing to run: every mutant asked for has run")
        if selected or not (args.sample or args.survivors):
            run = [*MUTMUT, "run", "--max-children", str(args.max_children), *selected]
            # One thread per mutant: mutmut forks its workers from a process that has imported (and may
            # have run) torch, and a child forked after OpenMP started hangs in its first parallel region
            # (every such mutant then ends as a false timeout).
            # (The tests run in mutants/: tests/helpers.real_data_dir finds the real datasets from there.)
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            with Stopwatch() as watch:
                subprocess.run(run, cwd=PROJECT_ROOT, check=True, env=env)
            wall = watch.seconds
    statuses = results()
    per_area = sample_size()
    written = page(statuses, load_equivalents(), wall, sample(list(statuses), per_area) if per_area else None)
    # The planted flips' block (experiments/flips.py) is that script's to write: kept as it was.
    kept = (
        re.search(re.escape(FLIPS_BEGIN) + ".*?" + re.escape(FLIPS_END), RESULTS.read_text(), re.S)
        if RESULTS.exists()
        else None
    )
    RESULTS.write_text(written.rstrip() + (f"\n\n{kept.group(0)}\n" if kept else "\n"))
    print(f"wrote {RESULTS.relative_to(PROJECT_ROOT)}")


if __name__ == "__main__":
    main()
