"""Compare runs: ``python -m capsexp.compare <folder> [--output DIR]``.

Finds every run under ``folder`` (a multirun, or all of ``logs/``): a folder with
``.hydra/overrides.yaml`` and ``tensorboard/`` event files. Runs whose overrides differ only by ``seed``
form one configuration. Writes ``comparison.md`` and ``comparison.csv`` (per configuration: count, and
mean ± std over seeds of the best validation accuracy and the final test accuracies, every
``test/acc_rot*`` included), ``val_acc.png`` (validation accuracy curves) and, where rotated test sets
were logged, ``rotation.png`` (test accuracy versus angle).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from capsexp.errors import CapsexpError
from capsexp.results.compare import compare


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m capsexp.compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folder", type=Path, help="a multirun folder, or logs/ for every run")
    parser.add_argument("--output", type=Path, default=None, help="where to write (default: the folder)")
    args = parser.parse_args(argv)
    try:
        output = compare(args.folder, args.output)
    except CapsexpError as error:
        parser.exit(error.exit_code, f"error: {error}\n")
    print((output / "comparison.md").read_text())
    print(f"Written to {output}: comparison.md, comparison.csv and the PNG plots.")


if __name__ == "__main__":
    main()
