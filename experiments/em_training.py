"""Why EM capsules trained slowly, and which recipe fixes it: em_caps_small on MNIST under competing
recipes, beside LeNet5 and CapsNet trained the same way.

    python experiments/em_training.py --quick     # CPU: 600 steps of batch 32 per run, seed 1 (about 4.5 min a run)
    python experiments/em_training.py --quick --seeds 1 2 3 --recipes LeNet5 default   # 3 seeds each
    python experiments/em_training.py             # GPU: 2 epochs per run, seeds 1, 2, 3

Each recipe is ``model=em_caps_small`` (capsexp's default recipe) with at most a few keys changed
back towards the paper or elsewhere (``paper`` is ``model=em_caps_small_paper``); every run
validates every 200 steps. Writes experiments/results/em_training_<mode>/: README.md (recipe table,
validation accuracy at fixed steps, the routing diagnostics of each run), comparison.csv,
val_acc.png and curves.png (validation accuracy against steps, one line per recipe).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from capsexp.results.metric_names import PRESENCE_GAP, VAL_ACC, VAL_ACC_BEST, presence_metric
from studylib import SIGNIFICANCE, display_path, mean_std, p_value_text, parse_args, run_main, run_seconds, welch_p
from timing import Stopwatch

if TYPE_CHECKING:
    from capsexp.results.compare import Run

STUDY = "em_training"

BASELINES = {
    "LeNet5": ["model=lenet5"],
    "CapsNet": ["model=capsnet"],
}
# name: (overrides of model=em_caps_small, what it tests)
RECIPES: dict[str, tuple[list[str], str]] = {
    "default": (
        [],
        "capsexp's recipe: 2 EM iterations with the E-step's log-likelihood divided by 4, final lambda 10 "
        "with a learned factor per layer, standardised costs, sigma_eps 1e-2, ConvCaps routed per window, "
        "BatchNorm after conv1, margin 0.2 -> 0.9 over the first 35% of the run, Adam's lr decayed to 0 by a cosine",
    ),
    "paper": (
        ["model=em_caps_small_paper"],
        "the paper's recipe: 3 iterations, final lambda 0.01, plain costs, "
        "sigma_eps 1e-4, children shared across windows, no BatchNorm, "
        "margin over 10 epochs",
    ),
    "paper+standardize": (
        ["model=em_caps_small_paper", "model.net.routing.cost_normalization=standardize"],
        "the paper's, costs standardised (the old normalize_cost=true)",
    ),
    "3 iterations": (["model.net.routing.iterations=3"], "one E-step more (the paper's 3 iterations)"),
    "sigma_eps 1e-4": (["model.net.routing.sigma_eps=1e-4"], "the old variance floor"),
    "final lambda 0.01": (
        ["model.net.routing.final_lambda=0.01"],
        "the authors' inverse temperature with standardised costs (and the learned factor)",
    ),
    "final lambda 1": (["model.net.routing.final_lambda=1"], "a tenth of the default inverse temperature"),
    "final lambda 10, fixed": (
        ["model.net.routing.learn_inverse_temperature=false"],
        "the default's inverse temperature without the learned factor",
    ),
    "cost: plain": (
        [
            "model.net.routing.cost_normalization=none",
            "model.net.routing.final_lambda=0.01",
            "model.net.routing.learn_inverse_temperature=false",
        ],
        "costs as in Procedure 1 (with the authors' lambda, on their scale)",
    ),
    "cost: data": (
        ["model.net.routing.cost_normalization=data", "model.net.routing.final_lambda=1"],
        "Gritzman 2019 pitfall 2: the amount of data relative to the mean parent's",
    ),
    "shared children": (
        ["model.net.routing.route_per_window=false"],
        "ConvCaps children shared among all overlapping windows (the paper; Gritzman's pitfall 3)",
    ),
    "no BatchNorm": (["model.net.conv1_norm=false"], "conv1 without BatchNorm, as in the paper"),
    "W std 1": (["model.net.weight_std=1.0"], "larger transformation matrices (votes twice as large)"),
    "margin: paper": (["model/margin=linear"], "the paper's margin ramp over 10 epochs (still 0.22 at step 600)"),
    "lr 1e-2": (["model.optimizer.lr=0.01"], "learning rate 1e-2 instead of the authors' 3e-3"),
    "1 iteration": (["model.net.routing.iterations=1"], "no E-step at all (not routing: a reference point)"),
    "final lambda 3, fixed": (
        ["model.net.routing.final_lambda=3", "model.net.routing.learn_inverse_temperature=false"],
        "standardised costs at a fixed inverse temperature (lambda_2 = 0.29; the default before the learned factor)",
    ),
    "final lambda 30, fixed": (
        ["model.net.routing.final_lambda=30", "model.net.routing.learn_inverse_temperature=false"],
        "standardised costs at a fixed inverse temperature that can separate classes (lambda_2 = 2.9)",
    ),
    "learned temperature, final lambda 3": (
        ["model.net.routing.final_lambda=3"],
        "the learned factor on the inverse temperatures, from lambda_2 = 0.29",
    ),
    "cost: layer": (
        [
            "model.net.routing.cost_normalization=layer",
            "model.net.routing.final_lambda=3",
            "model.net.routing.learn_inverse_temperature=false",
        ],
        "plain costs, the amount of data divided by the children per parent (IBM's layer factor)",
    ),
    "cost: layer, learned temperature": (
        ["model.net.routing.cost_normalization=layer", "model.net.routing.final_lambda=3"],
        "as cost: layer, with the learned factor on the inverse temperatures",
    ),
    "margin over 500 steps": (
        ["model/margin=linear_steps", "model.margin.duration=500"],
        "the margin reaches 0.9 at step 500: the whole gap asked for before the end of the quick budget",
    ),
    "margin over 600 steps": (
        ["model/margin=linear_steps", "model.margin.duration=600"],
        "the margin reaches 0.9 at step 600, the end of the quick budget",
    ),
    "margin over 1,000 steps": (
        ["model/margin=linear_steps", "model.margin.duration=1000"],
        "the margin reaches 0.9 at step 1,000 (0.62 at step 600)",
    ),
    "margin over 750 steps": (
        ["model/margin=linear_steps", "model.margin.duration=750"],
        "the margin reaches 0.9 at step 750 (0.76 at step 600)",
    ),
    "margin over 35% of the run": (
        ["model/margin=linear_run"],
        "the margin reaches 0.9 after 35% of the run's steps (210 of 600; 602 of a 1,719-step epoch)",
    ),
    "temperature lr x10": (
        ["model.lr_multipliers={log_inverse_temperature:10}"],
        "the learned factors on the inverse temperatures learn at 10x the learning rate",
    ),
    "cost: plain, learned temperature": (
        ["model.net.routing.cost_normalization=none", "model.net.routing.final_lambda=0.01"],
        "costs as in Procedure 1 with the authors' lambda, and the learned factor on it",
    ),
}
# Shared by every run. Validation on the whole validation set (5,000 digits) every 200 steps.
QUICK = [
    "seed=1",
    "data=mnist",
    "data.batch_size=32",
    "trainer.max_steps=600",
    "trainer.max_epochs=1",
    "trainer.val_check_interval=200",
    "test=false",
    "trainer.accelerator=cpu",
]
FULL = ["seed=1,2,3", "data=mnist", "data.batch_size=32", "trainer.max_epochs=2", "trainer.val_check_interval=200"]
CURVE_STEPS = (200, 400, 600)


def val_curve(run: Run) -> list[tuple[int, float]]:
    """(training steps done, val/acc): Lightning logs a validation after step N at step N - 1."""
    return [(step + 1, value) for step, value in run.scalars.get(VAL_ACC, [])]


def routing_summary(run: Run) -> tuple[str, str, str]:
    """Per EM layer, first -> last recorded value of the normalised entropy of the responsibilities,
    of the spread (std) of the parent activations over all capsules and inputs, and of the spread of
    each capsule's activation across inputs."""
    entropy, spread, across_inputs = [], [], []
    for layer in ("conv_caps1", "conv_caps2", "class_caps"):
        for parts, key in (
            (entropy, "entropy"),
            (spread, "activation_std"),
            (across_inputs, "activation_std_across_inputs"),
        ):
            values = run.scalars.get(f"routing/{layer}/{key}")
            if values:
                parts.append(f"{values[0][1]:.2f}->{values[-1][1]:.2f}")
    return " / ".join(entropy), " / ".join(spread), " / ".join(across_inputs)


def presence_summary(run: Run) -> str:
    """At the last validation: medians over the validation digits of the target class's score minus
    the largest other's, of the target's score and of the largest other's."""
    values = [run.scalars.get(presence_metric(key)) for key in ("gap", "target", "largest_other")]
    if not all(values):
        return ""
    gap, target, other = (series[-1][1] for series in values)
    return f"{gap:.2f} ({target:.2f} - {other:.2f})"


def curve_table(folder: Path, names: list[str], descriptions: dict[str, str]) -> tuple[str, dict]:
    """Markdown table of validation accuracy at fixed steps, one row per recipe (its first seed's run)."""
    from capsexp.results.compare import find_runs

    header = " | ".join(f"step {s}" for s in CURVE_STEPS)
    lines = [
        f"| recipe | {header} | best | presence gap (target - largest other) | routing entropy c1 / c2 / class "
        "(first->last) | activation std c1 / c2 / class (first->last) | activation std across inputs c1 / c2 / "
        "class (first->last) | what it tests |",
        "| --- | " + " | ".join("---:" for _ in CURVE_STEPS) + " | ---: | ---: | --- | --- | --- | --- |",
    ]
    curves = {}
    for name in names:
        runs = sorted((folder / slug(name)).rglob(".hydra/overrides.yaml"))
        if not runs:
            continue
        found = find_runs(runs[0].parent.parent)
        if not found:
            continue
        curve = val_curve(found[0])
        curves[name] = curve
        at = dict(curve)
        cells = " | ".join(f"{100 * at[s]:.1f}" if s in at else "" for s in CURVE_STEPS)
        best = f"{100 * max(v for _, v in curve):.1f}" if curve else ""
        entropy, spread, across_inputs = routing_summary(found[0])
        lines.append(
            f"| {name} | {cells} | {best} | {presence_summary(found[0])} | {entropy} | {spread} | {across_inputs} "
            f"| {descriptions.get(name, '')} |"
        )
    return "\n".join(lines) + "\n", curves


def seeds_table(folder: Path, names: list[str], reference: str) -> str:
    """One line per recipe, over all its runs (seeds): final and best validation accuracy and the
    presence gap, mean ± std, with Welch's p-value against the ``reference`` recipe."""
    from capsexp.results.compare import find_runs

    runs = {name: find_runs(folder / slug(name)) for name in names if (folder / slug(name)).is_dir()}

    def finals(name: str, metric: str) -> list[float]:
        return [v for v in (run.final(metric) for run in runs.get(name, [])) if v is not None]

    against = f"p vs {reference}"
    lines = [
        f"| recipe | runs | val acc, final (%) | val acc, best (%) | {against} | presence gap | {against} |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def p_text(name: str, metric: str) -> str:
        return p_value_text(welch_p(finals(name, metric), finals(reference, metric)) if name != reference else None)

    for name in runs:
        cells = [
            mean_std(finals(name, VAL_ACC), 100),
            mean_std(finals(name, VAL_ACC_BEST), 100),
            p_text(name, VAL_ACC),
            mean_std(finals(name, PRESENCE_GAP)),
            p_text(name, PRESENCE_GAP),
        ]
        lines.append(f"| {name} | {len(runs[name])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_curves(curves: dict[str, list[tuple[int, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 5.5))
    for name, curve in curves.items():
        if not curve:
            continue
        steps, values = zip(*curve, strict=True)
        style = "-" if name in BASELINES or name in ("default", "paper") else "--"
        axes.plot(
            steps,
            [100 * v for v in values],
            style,
            marker="o",
            markersize=3,
            label=name,
            linewidth=2.5 if name in ("default", "LeNet5") else 1.2,
        )
    axes.set_xlabel("training step (batch 32)")
    axes.set_ylabel("validation accuracy (%)")
    axes.set_ylim(0, 100)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, ncol=2, loc="lower right")
    axes.set_title("em_caps_small on MNIST: recipes against the baselines")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def rebuilt_wall_time(folder: Path) -> float:
    """The runs' summed durations (from their event times, which survive copying): the training time
    of an earlier execution, without the start-up of each run."""
    from capsexp.results.compare import find_runs

    return sum(seconds for run in find_runs(folder) if (seconds := run_seconds(run)) is not None)


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def main(argv: list[str] | None = None) -> int:
    names = [*BASELINES, *RECIPES]

    def add_options(parser) -> None:
        parser.add_argument(
            "--recipes",
            nargs="+",
            choices=names,
            default=names,
            metavar="NAME",
            help=f"run only these (default: all): {', '.join(repr(n) for n in names)}",
        )
        parser.add_argument(
            "--seeds",
            nargs="+",
            type=int,
            default=None,
            metavar="SEED",
            help="seeds of every run (default: 1 in quick mode, 1 2 3 in full); the per-step table shows the first",
        )
        parser.add_argument(
            "--reference",
            default="default",
            metavar="NAME",
            help="with several seeds: the recipe the others are tested against (Welch's t-test)",
        )
        parser.add_argument(
            "--rebuild",
            type=Path,
            metavar="FOLDER",
            help="run nothing: write the results page from the runs of an earlier execution "
            "(<log dir>/em_training/multiruns/<time>)",
        )

    study, args = parse_args(STUDY, __doc__, argv, add_options)
    budget = QUICK if study.quick else FULL
    if args.seeds:
        budget = [f"seed={','.join(map(str, args.seeds))}", *(o for o in budget if not o.startswith("seed="))]
    seeds = next(o for o in budget if o.startswith("seed=")).removeprefix("seed=").split(",")
    seeds_text = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(seeds)}"
    study_folder = args.rebuild.resolve() if args.rebuild else study.new_folder()
    descriptions = {name: description for name, (_, description) in RECIPES.items()}
    descriptions.update(LeNet5="the CNN baseline (cross-entropy)", CapsNet="dynamic routing (Sabour et al. 2017)")
    runs = {**BASELINES, **{name: ["model=em_caps_small", *overrides] for name, (overrides, _) in RECIPES.items()}}
    runs = {name: overrides for name, overrides in runs.items() if name in args.recipes}
    commands = []
    with Stopwatch() as watch:
        for name, overrides in runs.items():
            if args.rebuild:
                if (study_folder / slug(name)).is_dir():
                    commands.append(study.command_text([*overrides, *budget], study_folder / slug(name)))
                continue
            print(f"\n=== {name}", flush=True)
            _, command = study.multirun([*overrides, *budget], folder=study_folder / slug(name))
            commands.append(command)
    wall_s = rebuilt_wall_time(study_folder) if args.rebuild else watch.seconds
    table, curves = curve_table(study_folder, list(runs), descriptions)

    def extra_section(output: Path) -> str:
        plot_curves(curves, output / "curves.png")
        return (
            "## Validation accuracy (%) by recipe\n\n"
            + table
            + "\nPresence gap: at the last validation, the median over the validation digits of the target "
            "class's score minus the largest other class's (in brackets the medians of the two; the spread "
            "loss asks for a gap up to its margin, 0.9; TensorBoard: `val/presence_gap`). Routing entropy: "
            "mean normalised entropy of each child's responsibilities over its parents (1 uniform, 0 hard "
            "assignments). Activation std: over all capsules and inputs of a training batch; across "
            "inputs: of each capsule (a parent type at one position) over the batch's inputs, averaged "
            "over capsules (0: activations that do not depend on the input). First and last recorded "
            "step (TensorBoard: `routing/<layer>/...`)."
            + (
                f" With {seeds_text}, this table and the curves show each recipe's first seed; the run comparison "
                "below gives the mean ± std over all of them."
                if len(seeds) > 1
                else ""
            )
            + "\n\n![curves](curves.png)\n\n"
            + (
                f"## Over seeds\n\nMean ± std over {seeds_text}; p: Welch's two-sided t-test against "
                f"{args.reference!r} of the final accuracy and of the gap (significant below {SIGNIFICANCE}).\n\n"
                + seeds_table(study_folder, list(runs), args.reference)
                + "\n"
                if len(seeds) > 1
                else ""
            )
        )

    budget_text = (
        f"600 steps of batch 32 (a third of an epoch), {seeds_text}, validation on all 5,000 validation digits "
        "every 200 steps"
        if study.quick
        else f"2 epochs of batch 32, {seeds_text}"
    )
    baselines_text = " and ".join(name for name in BASELINES if name in runs)
    if baselines_text:
        baselines_text = f"; {baselines_text}, each under its own default recipe, trained the same way alongside"
    notes = f"""
em_caps_small (A=64, B=8, C=D=16) on MNIST under each recipe, {budget_text}{baselines_text}. Runs under
`{display_path(study_folder)}/<recipe>/`. Every recipe but "1 iteration" routes every capsule layer with EM.
"""
    if args.rebuild:
        notes += """
Rebuilt from runs made earlier (`--rebuild`): the commands above are those this driver gives each
recipe today. Where the default recipe has changed since a run was made, the overrides it was launched
with (the run comparison below, and its `.hydra/overrides.yaml`) differ from them but set the same
options.
"""
    study.write_results(
        "EM capsule training recipes (em_caps_small, MNIST)",
        commands,
        study_folder,
        wall_s,
        notes,
        extra_section=extra_section,
        rebuilt=bool(args.rebuild),
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
