"""What the study drivers share: command-line options, a multirun through ``python -m capsexp``, the
comparison (``capsexp.compare``) and a results page in ``experiments/results/<study>_<mode>/``."""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from capsexp import PROJECT_ROOT
from capsexp.results.compare import compare
from capsexp.results.machine import cpu_name
from capsexp.results.metric_names import VAL_ACC

RESULTS = PROJECT_ROOT / "experiments" / "results"

# Quick mode (a CPU sitting), per net: the baseline CNN trains and tests under bf16 autocast, which
# nearly halves its time on a CPU with bf16 instructions (experiments/results/baseline_cnn.md); the
# other nets stay float32.
QUICK_NET_OPTIONS = {"baseline_cnn": ["trainer.precision=bf16-mixed"]}


class RunFailed(Exception):
    """A ``python -m capsexp`` run of a study exited with an error."""


@dataclass
class Study:
    """One execution of a study: its name and mode, where its runs and results go, and the Hydra
    overrides the user gave for every run."""

    name: str
    quick: bool = False
    overrides: list[str] = field(default_factory=list)
    data_dir: Path | None = None
    log_dir: Path | None = None
    output: Path | None = None

    def __post_init__(self) -> None:
        self.output = self.output or RESULTS / f"{self.name}_{self.mode}"

    @property
    def mode(self) -> str:
        return "quick" if self.quick else "full"

    def net_options(self, model: str) -> list[str]:
        """The overrides a study adds for ``model=<model>`` in this mode (:data:`QUICK_NET_OPTIONS`)."""
        return QUICK_NET_OPTIONS.get(model, []) if self.quick else []

    def net_options_text(self) -> str:
        """The sentence a results page gives :data:`QUICK_NET_OPTIONS` in quick mode; empty otherwise."""
        if not self.quick:
            return ""
        nets = "; ".join(f"{net} with `{' '.join(options)}`" for net, options in QUICK_NET_OPTIONS.items())
        return f"To fit a CPU sitting, quick mode runs {nets} (bf16 autocast); the other nets in float32."

    def environment(self) -> dict[str, str]:
        """The runs' environment: the data and log folders the study was given."""
        env = dict(os.environ)
        if self.data_dir:
            env["CAPSEXP_DATA_DIR"] = str(Path(self.data_dir).resolve())
        if self.log_dir:
            env["CAPSEXP_LOG_DIR"] = str(Path(self.log_dir).resolve())
        return env

    def log_root(self) -> Path:
        return Path(self.environment().get("CAPSEXP_LOG_DIR", PROJECT_ROOT / "logs"))

    def new_folder(self) -> Path:
        """``<log dir>/<study>/multiruns/<time>``: where one execution of the study puts its runs."""
        return self.log_root() / self.name / "multiruns" / datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")

    def run_capsexp(self, arguments: list[str]) -> str:
        """``python -m capsexp <arguments>``, its output shown live; :class:`RunFailed` if it fails.
        Returns the command as text, for the results page."""
        command = [sys.executable, "-m", "capsexp", *arguments]
        text = ("python " + " ".join(command[1:])).replace(str(PROJECT_ROOT.resolve()) + "/", "")
        print(f"$ {text}", flush=True)
        result = subprocess.run(command, cwd=PROJECT_ROOT, env=self.environment())
        if result.returncode:
            raise RunFailed(f"the run failed (exit {result.returncode}): {text}")
        return text

    def multirun_arguments(self, sweep: list[str], folder: Path) -> list[str]:
        return [
            "-m",
            *sweep,
            *self.overrides,
            f"task_name={self.name}",
            "callbacks.progress_bar=null",
            f"hydra.sweep.dir={folder}",
        ]

    def command_text(self, sweep: list[str], folder: Path) -> str:
        """The command :meth:`multirun` runs, as a results page shows it (paths relative to the repository)."""
        text = "python -m capsexp " + " ".join(self.multirun_arguments(sweep, folder))
        return text.replace(str(PROJECT_ROOT.resolve()) + "/", "")

    def multirun(self, sweep: list[str], folder: Path | None = None) -> tuple[Path, str]:
        """Run a multirun of ``sweep`` (plus the user's overrides) into ``folder`` (default: a new one);
        return the folder and the command. Progress bars are off: logs go to a terminal or a file alike."""
        folder = folder or self.new_folder()
        return folder, self.run_capsexp(self.multirun_arguments(sweep, folder))

    def write_results(
        self,
        title: str,
        commands: list[str],
        runs_folder: Path,
        wall_s: float,
        notes: str,
        extra_section: Callable[[Path], str] | None = None,
        rebuilt: bool = False,
    ) -> Path:
        """``capsexp.compare`` of ``runs_folder`` into the study's output folder, with a README.md around
        its table; ``extra_section(output)`` may add Markdown above the table, from the files written there.
        ``rebuilt``: the page is written from earlier runs, ``wall_s`` the sum of their durations."""
        output = self.output
        compare(runs_folder, output)
        comparison = (output / "README.md").read_text()
        table = comparison[comparison.index("## Results") :]
        page = "\n".join(
            [
                f"# {title} ({self.mode} mode)",
                "",
                f"- Machine: {machine()}; {datetime.date.today().isoformat()}; {wall_s / 60:.1f} min "
                + ("in all (the runs' own durations)." if rebuilt else "this sitting."),
                f"- Runs: `{display_path(runs_folder)}` (rebuild the tables: "
                "`python -m capsexp.compare <that folder>`).",
                "- Commands:",
                *[f"  - `{command}`" for command in commands],
                "",
                notes.strip(),
                "",
                extra_section(output) if extra_section else "",
                table,
            ]
        )
        (output / "README.md").write_text(page)
        print(f"\nResults: {output / 'README.md'}")
        return output


def job_folders(multirun: Path) -> list[Path]:
    """The jobs of a multirun folder, in job order."""
    return sorted((p for p in multirun.iterdir() if (p / ".hydra").is_dir()), key=lambda p: int(p.name))


def job_overrides(job: Path) -> list[str]:
    """A run's or a multirun job's command-line overrides (empty for a folder that is neither)."""
    import yaml

    path = job / ".hydra" / "overrides.yaml"
    return [str(o) for o in yaml.safe_load(path.read_text()) or []] if path.exists() else []


def best_checkpoint(run: Path) -> Path:
    """A run's best checkpoint by validation accuracy (the one beside last.ckpt)."""
    return next(p for p in sorted((run / "checkpoints").glob("*.ckpt")) if p.name != "last.ckpt")


def checkpoint_test_overrides(job: Path, *changed: str) -> list[str]:
    """The overrides of a test-only run of a training job's best checkpoint: the job's own, less those
    a study sets anew (task name, progress bar, Hydra's folders, the checkpoint, training) and those
    starting with ``changed``, then ``train=false ckpt_path=<best checkpoint>``."""
    reset = ("task_name=", "callbacks.progress_bar=", "hydra.", "ckpt_path=", "train=", *changed)
    kept = [o for o in job_overrides(job) if not o.startswith(reset)]
    return [*kept, "train=false", f"ckpt_path={best_checkpoint(job)}"]


def row_runs(folder: Path) -> list:
    """The runs under a study row's folder (none when it does not exist)."""
    from capsexp.results.compare import find_runs

    return find_runs(folder) if folder.is_dir() else []


def missing_seeds(folder: Path, seeds: Sequence[int], finished: str = VAL_ACC) -> list[int]:
    """The seeds of ``seeds`` without a finished run (one that logged ``finished``) under ``folder``."""
    done = set()
    for run in row_runs(folder):
        if run.final(finished) is not None:
            done.update(int(o.split("=", 1)[1]) for o in job_overrides(run.folder) if o.startswith("seed="))
    return [seed for seed in seeds if seed not in done]


def run_row(study: Study, sweep: list[str], seeds: Sequence[int], folder: Path, finished: str = VAL_ACC) -> str | None:
    """One row of a study: ``sweep`` (without a seed) for every seed, into ``folder``; seeds with a
    finished run there from an earlier sitting are not run again, the others go into the job folder the
    whole sweep would give them. Returns the row's command (the whole sweep), or None if nothing is there."""
    missing = missing_seeds(folder, seeds, finished)
    if list(missing) == list(seeds):
        study.multirun([*sweep, f"seed={','.join(map(str, seeds))}"], folder=folder)
    else:
        for seed in missing:
            study.multirun([*sweep, f"seed={seed}", f"hydra.sweep.subdir={list(seeds).index(seed)}"], folder=folder)
    if not folder.is_dir():
        return None
    return study.command_text([*sweep, f"seed={','.join(map(str, seeds))}"], folder)


def parse_args(
    study: str,
    description: str,
    argv: list[str] | None = None,
    add_options: Callable[[argparse.ArgumentParser], None] | None = None,
) -> tuple[Study, argparse.Namespace]:
    """The options every study has (``add_options`` adds a study's own), then Hydra overrides.
    Returns the :class:`Study` and the parsed options (for the study's own)."""
    parser = argparse.ArgumentParser(
        prog=f"python experiments/{study}.py",
        description=description,
        epilog="Extra arguments after the options are Hydra overrides passed to every run "
        "(e.g. trainer.accelerator=gpu trainer.devices=2).",
    )
    parser.add_argument("--quick", action="store_true", help="the short CPU version (minutes, not hours)")
    parser.add_argument(
        "--data-dir", type=Path, default=None, help="datasets folder (default: $CAPSEXP_DATA_DIR or data/)"
    )
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help="where the runs go (default: $CAPSEXP_LOG_DIR or logs/), under logs/<study>/",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help=f"results folder (default: experiments/results/{study}_quick or _full)",
    )
    if add_options:
        add_options(parser)
    args, overrides = parser.parse_known_args(argv)
    unknown = [o for o in overrides if o.startswith("-")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return Study(study, args.quick, overrides, args.data_dir, args.log_dir, args.output), args


def run_main(main: Callable[[], int | None]) -> int | str:
    """A study's entry point: its exit status, or the message of a failed run (``sys.exit`` prints it)."""
    try:
        return main() or 0
    except RunFailed as error:
        return str(error)


def display_path(path: Path) -> str:
    """``path`` relative to the repository when it lies inside (results pages hold no machine's paths)."""
    try:
        return str(Path(path).resolve().relative_to(PROJECT_ROOT.resolve()))
    except ValueError:
        return str(path)


def machine() -> str:
    import torch

    text = f"{cpu_name()}, {os.cpu_count()} cores"
    if torch.cuda.is_available():
        text += f", {torch.cuda.device_count()} x {torch.cuda.get_device_name()}"
    return text


def run_seconds(run) -> float | None:
    """A run's duration, first to last scalar event (survives copying the event files); None when
    its events carry no times of their own (all within a second: a file rewritten after the run)."""
    from capsexp.results.events import load_events

    events = load_events(run.folder)
    times = [event.wall_time for tag in events.Tags()["scalars"] for event in events.Scalars(tag)]
    span = max(times) - min(times) if times else 0.0
    return span if span >= 1.0 else None


def mean_std(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    if not values:
        return ""
    mean = scale * statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {scale * statistics.stdev(values):.{digits}f}"


def test_error_cell(row: dict[str, str]) -> str:
    """A comparison.csv row's test error in %, ``mean ± std`` over its runs (the mean alone for one run)."""
    error = f"{100 * (1 - float(row['test/acc mean'])):.2f}"
    if int(row["runs"]) > 1:
        error += f" ± {100 * float(row['test/acc std']):.2f}"
    return error


SIGNIFICANCE = 0.05  # the level below which a study calls a difference significant


def welch_p(a: list[float], b: list[float]) -> float | None:
    """Two-sided p-value of Welch's t-test (unequal variances), None with fewer than 2 runs a side."""
    from scipy.stats import ttest_ind

    if len(a) < 2 or len(b) < 2:
        return None
    return float(ttest_ind(a, b, equal_var=False).pvalue)


def significance_text(p_value: float | None) -> str:
    """A Welch test's verdict in words, for a page's prose: "Welch p = 0.009, significant" (below
    :data:`SIGNIFICANCE`), "... not significant", or why there is no test."""
    if p_value is None:
        return "fewer than 2 runs a side: no test"
    if math.isnan(p_value):
        return "every run of both sides gave the same value: no test"
    return f"Welch p = {p_value:.3f}, {'' if p_value < SIGNIFICANCE else 'not '}significant"


def p_value_text(p_value: float | None) -> str:
    """A table cell for a p-value: blank without one, "n/a (no spread)" when every run of both sides
    gave the same value, marked "(significant)" below :data:`SIGNIFICANCE`."""
    if p_value is None:
        return ""
    if math.isnan(p_value):
        return "n/a (no spread)"
    text = "< 0.001" if p_value < 0.001 else f"{p_value:.3f}"
    return text + (" (significant)" if p_value < SIGNIFICANCE else "")
