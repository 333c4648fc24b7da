"""Compare runs: ``python -m capsexp.compare <folder> [--output DIR] [--keep-runs] [--check]``.

Finds every run under ``folder`` (a multirun, a study's runs, or all of ``logs/``): a folder with
``.hydra/overrides.yaml`` and event files (in it, or in its ``tensorboard/``). Runs whose overrides
differ only by ``seed`` form one configuration. Writes the page ``README.md``: the machine, the dates,
the run time and the command; per configuration the number of runs, the mean ± std and the 95%
confidence interval of the test accuracy (or of the experiment's metric) and the other metrics'
mean ± std; each configuration against the reference (the experiment's, else the first) with a paired
t-test where they share seeds, Welch's otherwise, Holm-adjusted; for runs of an experiment config, its
paper's figures and its reproduction check; the notes' figures are filled in from the runs and their
claims checked (exit 1 naming a claim the runs do not support). Also ``comparison.csv`` (every metric's
mean, std and interval), ``headline.png`` (each run's headline metric, the means and their intervals),
``val_acc.png`` (validation curves, mean ± std over seeds) and, with rotated test sets, ``rotation.png``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from capsexp.errors import CapsexpError
from capsexp.results.compare import PAGE, compare
from capsexp.results.runs import KEPT_RUNS
from capsexp.results.tables import TABLE


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m capsexp.compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folder", type=Path, help="a multirun folder, a study's runs, or logs/ for every run")
    parser.add_argument("--output", type=Path, default=None, help="where to write (default: the folder)")
    parser.add_argument(
        "--keep-runs",
        action="store_true",
        help=f"copy the runs' overrides, machine and code records, configs (without paths) and event files "
        f"(kilobytes) into OUTPUT/{KEPT_RUNS}/, "
        "replacing the runs kept there, and write the page from the copies, so that it can be rebuilt from them",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit with status 1 when a configuration is outside the tolerance of the figures its experiment "
        "config expects for the budget it ran with",
    )
    args = parser.parse_args(argv)
    try:
        result = compare(args.folder, args.output, keep=args.keep_runs)
    except CapsexpError as error:
        parser.exit(error.exit_code, f"error: {error}\n")
    print((result.output / PAGE).read_text())
    print(f"Written to {result.output}: {PAGE}, {TABLE} and the PNG plots.")
    if args.check and result.failed:
        parser.exit(1, f"error: outside the expected figures' tolerance: {'; '.join(result.failed)}\n")


if __name__ == "__main__":
    main()
