"""Adversarial robustness (Hinton, Sabour & Frosst 2018, section 6, Fig. 3): LeNet5, the CapsNet
paper's baseline CNN, CapsNet and EM capsules, each trained once, then attacked over a sweep of eps
with FGSM and BIM, white-box and black-box (examples crafted on LeNet5, shown to the capsule nets).

    python experiments/adversarial.py --quick      # MNIST, one epoch per net, 1,000 test images attacked
    python experiments/adversarial.py              # smallNORB (the paper's setting), 50 epochs, all test images
    python experiments/adversarial.py --quick --folder logs/adversarial/multiruns/<time>   # complete a study

Every attack is ``python -m capsexp train=false ckpt_path=<best checkpoint> attack=fgsm,bim`` with the
training run's own options (docs/attacks.md). Writes experiments/results/adversarial_<mode>/: the
accuracy per eps of every model and attack, the gradient-masking checks, and the training runs' table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omegaconf import OmegaConf

from capsexp.results.events import read_scalars
from capsexp.results.metric_names import TEST_ACC
from studylib import best_checkpoint, checkpoint_test_overrides, job_overrides, parse_args, run_main
from timing import Stopwatch

STUDY = "adversarial"

EPS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5)
ATTACKS = ("fgsm", "bim")
CNN = "lenet5"  # the black-box attacks' source
QUICK_MODELS = ("lenet5", "baseline_cnn", "capsnet", "em_caps_small")
FULL_MODELS = ("lenet5", "baseline_cnn", "capsnet", "em_caps")
CAPSULE_MODELS = ("capsnet", "em_caps_small", "em_caps")
QUICK = ["data=mnist", "trainer.max_epochs=1", "seed=1"]
FULL = ["data=smallnorb", "trainer.max_epochs=50", "seed=1"]
QUICK_IMAGES = 1000  # test images attacked in quick mode


def num_classes(job: Path) -> int:
    return int(OmegaConf.load(job / ".hydra" / "config.yaml").geometry.num_classes)


def model_of(job: Path) -> str:
    return next(o.split("=", 1)[1] for o in job_overrides(job) if o.startswith("model="))


def trained_runs(folder: Path) -> dict[str, Path]:
    """{model: its training job} of the finished training runs under ``folder`` (none if absent)."""
    jobs = sorted(p.parent for p in folder.rglob(".hydra")) if folder.is_dir() else []
    return {model_of(job): job for job in jobs if TEST_ACC in read_scalars(job)}


def accuracy_curves(folder: Path) -> dict[tuple[str, str], dict[str, list[float]]]:
    """{(model, attack name): {"acc": [...], "zero": [fraction], "unseen": [fraction]}} of every attack
    run under ``folder`` (the crafting model's zero input gradients and never-seen input positions)."""
    curves = {}
    for job in sorted(folder.rglob(".hydra")) if folder.is_dir() else []:
        run = job.parent
        model, logged = model_of(run), read_scalars(run)
        for tag, points in logged.items():
            if tag.startswith("attack/") and tag.endswith("/acc"):
                name = tag.split("/")[1]
                curves[(model, name)] = {
                    "acc": [p.value for p in sorted(points, key=lambda p: p.step)],
                    "zero": [p.value for p in logged.get(f"attack/{name}/zero_gradient_fraction", [])],
                    "unseen": [p.value for p in logged.get(f"attack/{name}/unseen_input_fraction", [])],
                }
    return curves


def attack_table(curves: dict, eps: tuple[float, ...]) -> str:
    """Accuracy (%) per eps: a row per model and attack (white-box first, then black-box)."""
    lines = [
        "| model | attack | "
        + " | ".join(f"eps {e:g}" for e in eps)
        + " | zero input gradients (%) | input positions never seen (%) |",
        "| --- | --- |" + " ---: |" * (len(eps) + 2),
    ]
    for (model, name), curve in sorted(curves.items(), key=lambda item: ("blackbox" in item[0][1], item[0])):
        cells = [f"{100 * value:.2f}" for value in curve["acc"]]
        cells += [f"{100 * curve[key][0]:.2f}" if curve[key] else "" for key in ("zero", "unseen")]
        lines.append(f"| {model} | {name} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def findings(curves: dict, eps: tuple[float, ...], num_classes: int, at: float = 0.2) -> str:
    """What the curves say about the paper's three claims, and the gradient-masking checks, in
    sentences computed from them: capsule nets against the CNN under white-box FGSM (at ``at``, where
    the paper's Fig. 3 is read, and whether they stay above chance), under BIM, and under black-box
    examples crafted on the CNN."""
    column, chance = eps.index(at), 1 / num_classes

    def acc(model: str, name: str, i: int = column) -> float | None:
        curve = curves.get((model, name))
        return 100 * curve["acc"][i] if curve else None

    lines, capsules = [], sorted({m for m, _ in curves if m in CAPSULE_MODELS})
    for attack in ATTACKS:
        cnn = curves.get((CNN, attack))
        for model in capsules:
            ours = curves.get((model, attack))
            if ours is None or cnn is None:
                continue
            pairs = list(zip(eps, ours["acc"], cnn["acc"], strict=True))[1:]  # eps 0 is clean accuracy
            above = [f"{e:g}" for e, a, b in pairs if a > b]
            below = [f"{e:g}" for e, a, b in pairs if a <= b]
            floor = min(ours["acc"])
            matched = not below and (attack != "fgsm" or floor > chance)
            claim = "above the CNN at every eps" + (" and above chance" if attack == "fgsm" else "")
            lines.append(
                f"- White-box {attack.upper()}, {model}: above {CNN} at eps {', '.join(above) or 'none'}; "
                f"not above at eps {', '.join(below) or 'none'}; at eps {at:g} {acc(model, attack):.2f}% "
                f"against {acc(CNN, attack):.2f}%; lowest {100 * floor:.2f}% "
                f"({'above' if floor > chance else 'not above'} chance, {100 * chance:.0f}%). "
                f"The paper's claim ({claim}): {'matched' if matched else 'not matched'}."
            )
    for model in capsules:
        transfer, own = acc(model, "fgsm_blackbox"), acc(model, "fgsm")
        if transfer is not None and own is not None:
            lines.append(
                f"- Black-box FGSM at eps {at:g} (crafted on {CNN}): {model} {transfer:.2f}% against "
                f"{own:.2f}% under its own white-box examples and {acc(CNN, 'fgsm'):.2f}% for {CNN} under its own. "
                "The paper compares with a CNN attacked by another CNN's examples: with one CNN here, that "
                "claim is not tested."
            )
    masked, unseen = [], []
    for (model, name), curve in sorted(curves.items()):
        if "blackbox" in name:
            continue  # crafted on the CNN: its gradients are the ones the checks are about
        fgsm = curves.get((model, name.replace("bim", "fgsm")))
        if name.startswith("bim") and fgsm:
            worse = [f"{e:g}" for e, b, f in zip(eps, curve["acc"], fgsm["acc"], strict=True) if b > f]
            if worse:
                masked.append(f"{model}: BIM above FGSM at eps {', '.join(worse)}")
        if name == "fgsm" and curve["zero"]:
            never = f"{100 * curve['unseen'][0]:.2f}%" if curve["unseen"] else "not measured"
            unseen.append(f"{model} {100 * curve['zero'][0]:.2f}% (input positions never seen: {never})")
    lines.append(
        "- Gradient masking checks (white-box): "
        + ("; ".join(masked) if masked else "BIM never leaves more images right than FGSM at the same eps")
        + "; zero input gradients: "
        + ", ".join(unseen)
        + ". Positions never seen are those no class score depends on: no attack can use them."
    )
    for model in capsules:
        fgsm, bim = curves.get((model, "fgsm_blackbox")), curves.get((model, "bim_blackbox"))
        if fgsm and bim:
            above = [f"{e:g}" for e, b, f in zip(eps, bim["acc"], fgsm["acc"], strict=True) if b > f]
            if above:
                lines.append(
                    f"- Black-box, {model}: BIM's examples transfer less than FGSM's at eps {', '.join(above)} "
                    "(as Kurakin et al. 2017 found for iterative attacks); not a sign of masking, since the "
                    "gradients followed are the CNN's."
                )
    return "\n".join(lines) + "\n"


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", help="comma-separated model options (default: all of the mode)")
    parser.add_argument("--images", type=int, default=None, help="test images attacked (default: the mode's)")
    parser.add_argument(
        "--folder",
        type=Path,
        help="study folder to run into (default: a new one); nets trained and attacks run there are kept",
    )


def main(argv: list[str] | None = None) -> None:
    study, args = parse_args(STUDY, __doc__, argv, add_options)
    models = args.models.split(",") if args.models else (QUICK_MODELS if study.quick else FULL_MODELS)
    budget = QUICK if study.quick else FULL
    images = args.images or (QUICK_IMAGES if study.quick else None)
    study_folder = (args.folder or study.new_folder()).resolve()
    # ++: keys of a group that the sweep chooses (docs/attacks.md)
    sweep = ["attack=" + ",".join(ATTACKS), "++attack.eps=[" + ",".join(f"{e:g}" for e in EPS) + "]"]
    if images:
        sweep.append(f"++attack.max_images={images}")
    train_folder, attacks_folder = study_folder / "train", study_folder.with_name(f"{study_folder.name}_attacks")
    with Stopwatch() as watch:
        missing = [model for model in models if model not in trained_runs(train_folder)]
        if missing:  # into the study's train folder, or beside the runs of an earlier sitting
            folder = train_folder / "_".join(missing) if train_folder.exists() else train_folder
            study.multirun([f"model={','.join(missing)}", *budget], folder=folder)
        commands = [study.command_text([f"model={','.join(models)}", *budget], train_folder)]
        trained = {model: job for model, job in trained_runs(train_folder).items() if model in models}
        for model, job in trained.items():
            common = [*checkpoint_test_overrides(job), *sweep]
            runs = {"whitebox": common}
            if model in CAPSULE_MODELS and CNN in trained:
                runs[f"from_{CNN}"] = [*common, f"++attack.source={best_checkpoint(trained[CNN])}"]
            for name, overrides in runs.items():
                folder = attacks_folder / model / name
                if not accuracy_curves(folder):  # not attacked in an earlier sitting
                    study.multirun(overrides, folder=folder)
                commands.append(study.command_text(overrides, folder))
    curves = accuracy_curves(attacks_folder)
    attacked = f"the first {images:,} test images" if images else "every test image"
    notes = f"""
Each net is trained once (`{" ".join(budget)}`; its own recipe), then its best checkpoint (by
validation accuracy) is attacked on {attacked}: FGSM (one step of eps) and BIM (10 steps of 0.2 eps;
FGSM at the same eps beside it), untargeted, L-inf, pixel values in [0, 1]. White-box: crafted on the
attacked net itself. Black-box (`*_blackbox`): crafted on the {CNN} checkpoint, shown to the capsule
nets. eps 0 is each net's clean accuracy on those images. One training seed per net: the curves
compare nets, not recipes, and carry no error bars.

The paper (smallNORB, its own CNN, its Fig. 3): under white-box FGSM the capsule net's accuracy
stays far above the CNN's as eps grows, and above chance; under BIM it also does better than the
CNN; black-box examples crafted on a CNN hurt the capsule net about as much as they hurt a CNN.
"""
    study.write_results(
        "Adversarial robustness: capsule nets against CNNs (EM paper Fig. 3)",
        commands,
        train_folder,
        watch.seconds,
        notes,
        extra_section=lambda output: (
            "## Accuracy (%) under attack\n\n"
            + attack_table(curves, EPS)
            + "\n## What it shows\n\n"
            + findings(curves, EPS, num_classes(next(iter(trained.values()))))
            + "\nOne training seed per net: differences of a few points between nets are not evidence.\n\n"
        ),
    )


if __name__ == "__main__":
    sys.exit(run_main(main))
