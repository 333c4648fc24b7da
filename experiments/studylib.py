"""What the study drivers share: command-line options, a multirun through ``python -m capsexp``, the
comparison (``capsexp.compare``) and a results page in ``experiments/results/<study>_<mode>/``."""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchlib import cpu_name
from capsexp import PROJECT_ROOT
from capsexp.compare import compare

RESULTS = PROJECT_ROOT / "experiments" / "results"


def parse_args(
    study: str,
    description: str,
    argv: list[str] | None = None,
    add_options: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """The options every study has (``add_options`` adds a study's own), then Hydra overrides."""
    parser = argparse.ArgumentParser(
        prog=f"python experiments/{study}.py",
        description=description,
        epilog="Extra arguments after the options are Hydra overrides passed to every run "
        "(e.g. trainer.accelerator=gpu trainer.devices=2).",
    )
    parser.add_argument("--quick", action="store_true", help="the short CPU version (minutes, not hours)")
    parser.add_argument("--data-dir", default=None, help="datasets folder (default: $CAPSEXP_DATA_DIR or data/)")
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
    args.overrides = overrides
    args.mode = "quick" if args.quick else "full"
    args.output = args.output or RESULTS / f"{study}_{args.mode}"
    return args


def environment(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    if args.data_dir:
        env["CAPSEXP_DATA_DIR"] = str(Path(args.data_dir).resolve())
    if args.log_dir:
        env["CAPSEXP_LOG_DIR"] = str(args.log_dir.resolve())
    return env


def log_root(args: argparse.Namespace) -> Path:
    return Path(environment(args).get("CAPSEXP_LOG_DIR", PROJECT_ROOT / "logs"))


def display_path(path: Path) -> str:
    """``path`` relative to the repository when it lies inside (results pages hold no machine's paths)."""
    try:
        return str(Path(path).resolve().relative_to(PROJECT_ROOT.resolve()))
    except ValueError:
        return str(path)


def run_capsexp(arguments: list[str], args: argparse.Namespace) -> str:
    """``python -m capsexp <arguments>``, its output shown live; stops the study if a run fails.
    Returns the command as text, for the results page."""
    command = [sys.executable, "-m", "capsexp", *arguments]
    text = "python " + " ".join(command[1:])
    text = text.replace(str(PROJECT_ROOT.resolve()) + "/", "")
    print(f"$ {text}", flush=True)
    result = subprocess.run(command, cwd=PROJECT_ROOT, env=environment(args))
    if result.returncode:
        sys.exit(f"the run failed (exit {result.returncode}): {text}")
    return text


def new_folder(study: str, args: argparse.Namespace) -> Path:
    """``<log dir>/<study>/multiruns/<time>``: where one execution of a study puts its runs."""
    return log_root(args) / study / "multiruns" / datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


def multirun_arguments(study: str, sweep: list[str], args: argparse.Namespace, folder: Path) -> list[str]:
    return [
        "-m",
        *sweep,
        *args.overrides,
        f"task_name={study}",
        "callbacks.progress_bar=null",
        f"hydra.sweep.dir={folder}",
    ]


def command_text(sweep: list[str], args: argparse.Namespace, folder: Path, study: str | None = None) -> str:
    """The command :func:`multirun` runs, as a results page shows it (paths relative to the repository)."""
    study = study or folder.parent.parent.parent.name
    text = "python -m capsexp " + " ".join(multirun_arguments(study, sweep, args, folder))
    return text.replace(str(PROJECT_ROOT.resolve()) + "/", "")


def multirun(study: str, sweep: list[str], args: argparse.Namespace, folder: Path | None = None) -> tuple[Path, str]:
    """Run a multirun of ``sweep`` (plus the user's overrides) into ``folder`` (default: a new one);
    return the folder and the command. Progress bars are off: logs go to a terminal or a file alike."""
    folder = folder or new_folder(study, args)
    command = run_capsexp(multirun_arguments(study, sweep, args, folder), args)
    return folder, command


def machine() -> str:
    import torch

    text = f"{cpu_name()}, {os.cpu_count()} cores"
    if torch.cuda.is_available():
        text += f", {torch.cuda.device_count()} x {torch.cuda.get_device_name()}"
    return text


def write_results(
    args: argparse.Namespace,
    title: str,
    commands: list[str],
    runs_folder: Path,
    wall_s: float,
    notes: str,
    extra_section: Callable[[Path], str] | None = None,
) -> Path:
    """``capsexp.compare`` of ``runs_folder`` into ``args.output``, with a README.md around its table;
    ``extra_section(output)`` may add Markdown above the table, from the files written there."""
    output = args.output
    compare(runs_folder, output)
    table = (output / "comparison.md").read_text().replace("# Run comparison", "## Run comparison", 1)
    plots = "".join(f"\n![{png.stem}]({png.name})\n" for png in sorted(output.glob("*.png")))
    page = "\n".join(
        [
            f"# {title} ({args.mode} mode)",
            "",
            f"- Machine: {machine()}; {datetime.date.today().isoformat()}; {wall_s / 60:.1f} min in all.",
            f"- Runs: `{display_path(runs_folder)}` (rebuild the tables: `python -m capsexp.compare <that folder>`).",
            "- Commands:",
            *[f"  - `{command}`" for command in commands],
            "",
            notes.strip(),
            "",
            extra_section(output) if extra_section else "",
            table,
            plots,
        ]
    )
    (output / "README.md").write_text(page)
    print(f"\nResults: {output / 'README.md'}")
    return output


class Timer:
    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self.start
