"""MultiMNIST (Sabour et al. 2017, section 6, Table 1): CapsNet with 1 and 3 routing iterations against
the paper's baseline CNN and LeNet5, on two overlapping digits per image.

    python experiments/multimnist.py --quick      # CPU: 600 steps of 32 pairs per run, seeds 1 and 2
    python experiments/multimnist.py              # full (GPU): 30 epochs, 1,000 test pairs per digit
    python experiments/multimnist.py --quick --folder logs/multimnist/multiruns/<time>   # complete a study

Each net is a row, run for every seed into ``<study folder>/<row>/``; with ``--folder``, the runs
finished there (tested) are kept and only the others are run.

Every net sees the same training pairs (drawn afresh at every step from the seed), steps and batch;
each keeps its own optimiser recipe from its model config. The error is the paper's: an image counts
as right only when the two highest class scores name both digits. Writes
experiments/results/multimnist_<mode>/: README.md (error per net beside the paper's), comparison.csv,
val_acc.png, and reconstructions.png (the paper's Fig. 5: inputs above each digit's reconstruction).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from capsexp.results.events import load_events
from capsexp.results.metric_names import TEST_ACC
from studylib import (
    job_overrides,
    parse_args,
    row_runs,
    run_main,
    run_row,
    significance_text,
    test_error_cell,
    welch_p,
)
from timing import Stopwatch

STUDY = "multimnist"

# The paper's Table 1, MultiMNIST test error (%): its CNN baseline and CapsNet with the reconstruction loss.
PAPER_ERROR = {"baseline_cnn": "8.1", "capsnet, 1 iteration": "7.5", "capsnet, 3 iterations": "5.2"}

SEEDS = (1, 2)
# Rows of the study: a net each, its options; each row's runs go to <study folder>/<row>/.
ROWS = {
    "capsnet_1": ["model=capsnet", "model.net.routing.iterations=1"],
    "capsnet_3": ["model=capsnet", "model.net.routing.iterations=3"],
    "lenet5": ["model=lenet5"],
    # Last: the slowest by far on a CPU (its second convolution, 256 -> 256 channels of 5x5 at full
    # resolution, is about 2 GMAC per 36x36 image).
    "baseline_cnn": ["model=baseline_cnn"],
}
QUICK = ["trainer.max_steps=600", "trainer.val_check_interval=200", "trainer.limit_val_batches=32"]
FULL = ["trainer.max_epochs=30", "data.pairs_per_digit=1000"]


QUICK_CAVEAT = "The paper trained far longer than these runs: compare the nets with each other, not with its column."


def net_name(configuration: str) -> str:
    """``model=capsnet model.net.routing.iterations=3`` -> ``capsnet, 3 iterations``."""
    words = dict(part.split("=", 1) for part in configuration.split() if "=" in part)
    iterations = words.get("model.net.routing.iterations")
    if iterations is None:
        return words["model"]
    return f"{words['model']}, {iterations} iteration{'s' if iterations != '1' else ''}"


def paper_table(comparison_csv: Path) -> str:
    """Our test error per net beside the paper's Table 1."""
    lines = [
        "| net | runs | test error here (%) | paper, Table 1 (%) |",
        "| --- | ---: | ---: | ---: |",
    ]
    with open(comparison_csv) as handle:
        for row in csv.DictReader(handle):
            name = net_name(row["configuration"])
            lines.append(f"| {name} | {row['runs']} | {test_error_cell(row)} | {PAPER_ERROR.get(name, '')} |")
    return "\n".join(lines) + "\n"


# Comparisons the page reports: (row, the row it is compared with).
COMPARISONS = [
    ("capsnet_3", "capsnet_1"),
    ("capsnet_3", "baseline_cnn"),
    ("capsnet_1", "baseline_cnn"),
    ("baseline_cnn", "lenet5"),
]


def what_it_shows(study_folder: Path) -> str:
    """Each comparison of :data:`COMPARISONS`: test errors, difference, Welch's p over the seeds."""
    errors = {row: [100 * (1 - run.final(TEST_ACC)) for run in row_runs(study_folder / row)] for row in ROWS}
    lines = ["## What it shows", ""]
    for row, other in COMPARISONS:
        if not (errors[row] and errors[other]):
            continue
        mean, other_mean = (sum(errors[name]) / len(errors[name]) for name in (row, other))
        name, other_name = (net_name(" ".join(ROWS[key])) for key in (row, other))
        papers = [PAPER_ERROR.get(key) for key in (name, other_name)]
        paper = f"the paper: {papers[0]}% against {papers[1]}%" if all(papers) else "not in the paper"
        significance = significance_text(welch_p(errors[row], errors[other]))
        lines.append(
            f"- {name} against {other_name}: test error {mean:.2f}% against {other_mean:.2f}% "
            f"({mean - other_mean:+.2f} points; {significance}); {paper}."
        )
    lines += [
        "",
        f"{len(SEEDS)} seeds per net: only large differences can be significant, and one that is not is no "
        "evidence that the nets are equal.",
        "",
    ]
    return "\n".join(lines)


def save_reconstructions(run: Path, output: Path) -> str:
    """The last ``val/reconstructions`` image of a CapsNet run, as ``reconstructions.png`` in ``output``."""
    events = load_events(run, images=0)
    if "val/reconstructions" not in events.Tags()["images"]:
        return ""
    image = events.Images("val/reconstructions")[-1]
    (output / "reconstructions.png").write_bytes(image.encoded_image_string)
    return (
        "## Reconstructions (the paper's Fig. 5)\n\n"
        f"CapsNet, 3 routing iterations, seed 1, at step {image.step}: validation inputs (top row of each "
        "pair) above the two digits reconstructed each from its own capsule (the two longest), in red and "
        "green, overlaid.\n\n![reconstructions](reconstructions.png)\n\n"
    )


def main(argv: list[str] | None = None) -> None:
    def add_options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--folder", type=Path, help="study folder to run into (default: a new one); finished runs are kept"
        )

    study, args = parse_args(STUDY, __doc__, argv, add_options)
    budget = QUICK if study.quick else FULL
    study_folder = (args.folder or study.new_folder()).resolve()
    commands = []
    with Stopwatch() as watch:
        for name, options in ROWS.items():
            sweep = [*options, "data=multi_mnist", *budget, *study.net_options(options[0].removeprefix("model="))]
            command = run_row(study, sweep, SEEDS, study_folder / name, TEST_ACC)
            commands.append(command)
    figure_run = next(
        job for job in sorted((study_folder / "capsnet_3").iterdir()) if "seed=1" in set(job_overrides(job))
    )
    budget_text = (
        "600 steps of 32 pairs (19,200 training pairs, a third of an epoch of distinct first digits), "
        "validation on 1,024 pairs every 200 steps, the test on 10,000 pairs (one per test digit)"
        if study.quick
        else "30 epochs of 32 pairs a step, the test on 10M pairs (1,000 per test digit)"
    )
    notes = f"""
MultiMNIST as the paper builds it (section 6.1): a digit over a digit of another class from the same
split, each shifted by up to 4 pixels on a 36x36 canvas, pixels summed and clipped. Training: {budget_text};
seeds 1 and 2. Tested with the best checkpoint by validation accuracy. Error: an image is right only
when both of its digits are the two highest scores. CapsNet: margin loss with both classes present, each
digit reconstructed from its own capsule (the reconstruction loss of both); LeNet5 and the baseline CNN:
independent sigmoids, top two. {study.net_options_text()}
{QUICK_CAVEAT if study.quick else ""}
"""
    study.write_results(
        "MultiMNIST: CapsNet against CNN baselines (paper Table 1)",
        commands,
        study_folder,
        watch.seconds,
        notes,
        extra_section=lambda output: (
            "## Against the paper\n\n"
            + paper_table(output / "comparison.csv")
            + "\n"
            + save_reconstructions(figure_run, output)
            + what_it_shows(study_folder)
        ),
    )


if __name__ == "__main__":
    sys.exit(run_main(main))
