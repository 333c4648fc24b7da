"""EM capsules on smallNORB (Hinton, Sabour & Frosst 2018): the paper's configuration, and the
novel-viewpoint experiments (section 5.1) against a CNN baseline.

    python experiments/em_smallnorb.py --quick      # em_caps_small, 300 steps per run
    python experiments/em_smallnorb.py              # em_caps (A=B=C=D=32), 50 epochs per run

1. ``model=em_caps data=smallnorb``: all viewpoints, seeds 1 and 2.
2. Novel viewpoints: EM capsules and LeNet5 (our CNN baseline) trained on the training viewpoints of
   ``data.viewpoint=azimuth`` (azimuths 300-40°) or ``elevation`` (the 3 lowest), each tested on the
   familiar viewpoints and, from the same best checkpoint, on the novel ones.

Runs only where smallNORB is present (<data dir>/smallnorb/, the six official files); otherwise it
says what is missing and exits without running anything. Writes experiments/results/em_smallnorb_<mode>/.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from capsexp import PROJECT_ROOT
from capsexp.errors import CapsexpError
from capsexp.events import last_scalar
from capsexp.timing import Stopwatch
from studylib import parse_args, run_main

STUDY = "em_smallnorb"

QUICK = ["trainer.max_epochs=1", "trainer.limit_train_batches=300", "trainer.limit_val_batches=16"]
FULL = ["trainer.max_epochs=50"]
# A training job's overrides that its test on the novel viewpoints sets anew.
RESET_FOR_NOVEL_TEST = ("data.familiar=", "task_name=", "callbacks.progress_bar=", "hydra.")


def smallnorb_problem(data_dir: Path, overrides: list[str]) -> str | None:
    """Why smallNORB cannot be used from ``data_dir`` (files missing or damaged), or None. Checks
    what the runs will check (md5s unless ``data.verify_checksums=false`` is among the overrides)."""
    from capsexp.data import SmallNORBDataModule

    verify = "data.verify_checksums=false" not in [o.lower() for o in overrides]
    try:
        SmallNORBDataModule(data_dir=data_dir, download=False, verify_checksums=verify).prepare_data()
    except CapsexpError as error:
        return str(error)
    return None


def novel_viewpoint_table(jobs: list[Path], novel_accuracy: dict[Path, float]) -> str:
    lines = [
        "## Novel viewpoints",
        "",
        "Test accuracy (%) of each run's best checkpoint on the viewpoints it was trained on and on the "
        "others. The paper compares the two nets at matched familiar-viewpoint accuracy.",
        "",
        "| model | viewpoint | seed | familiar | novel |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for job in jobs:
        overrides = dict(o.split("=", 1) for o in yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()))
        lines.append(
            f"| {overrides['model']} | {overrides['data.viewpoint']} | {overrides.get('seed', '')} | "
            f"{100 * last_scalar(job, 'test/acc'):.2f} | {100 * novel_accuracy[job]:.2f} |"
        )
    return "\n".join(lines) + "\n\n"


def main(argv: list[str] | None = None) -> int:
    study, _ = parse_args(STUDY, __doc__, argv)
    data_dir = Path(study.environment().get("CAPSEXP_DATA_DIR", PROJECT_ROOT / "data"))
    problem = smallnorb_problem(data_dir, study.overrides)
    if problem:
        print(
            f"em_smallnorb: not run, smallNORB is not usable here.\n\n{problem}\n\n"
            "With a network, `python -m capsexp data=smallnorb` downloads it (about 250 MB) first.",
            file=sys.stderr,
        )
        return 0
    budget = QUICK if study.quick else FULL
    model = "em_caps_small" if study.quick else "em_caps"
    commands = []
    study_folder = study.new_folder()
    with Stopwatch() as watch:
        _, command = study.multirun(
            [f"model={model}", "data=smallnorb", "seed=1,2", *budget],
            folder=study_folder / "all_viewpoints",
        )
        commands.append(command)
        viewpoint_folder, command = study.multirun(
            [
                f"model={model},lenet5",
                "data=smallnorb",
                "data.viewpoint=azimuth,elevation",
                "data.familiar=true",
                "seed=1",
                *budget,
            ],
            folder=study_folder / "familiar_viewpoints",
        )
        commands.append(command)
        jobs = sorted((p for p in viewpoint_folder.iterdir() if (p / ".hydra").is_dir()), key=lambda p: int(p.name))
        novel_accuracy = {}
        for job in jobs:
            job_overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
            best = next(p for p in (job / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt")
            # Beside the study's folder, not in it: capsexp.compare of that folder lists training runs.
            novel_dir = study_folder.with_name(f"{study_folder.name}_novel_viewpoints") / job.name
            commands.append(
                study.run_capsexp(
                    [
                        *[o for o in job_overrides if not o.startswith(RESET_FOR_NOVEL_TEST)],
                        "data.familiar=false",
                        "train=false",
                        f"ckpt_path={best}",
                        f"task_name={STUDY}",
                        "callbacks.progress_bar=null",
                        f"hydra.run.dir={novel_dir}",
                    ],
                )
            )
            novel_accuracy[job] = last_scalar(novel_dir, "test/acc")
    notes = f"""
smallNORB: 5 categories, stereo pairs downsampled to 48x48, random 32x32 crops with brightness and
contrast jitter in training, centre crops in testing. Model `{model}`; training budget
`{" ".join(budget)}`. Below the novel-viewpoint table, `capsexp.compare` of every training run: on
all viewpoints, and on the training viewpoints of each protocol (tested on those).
"""
    study.write_results(
        "EM capsules on smallNORB",
        commands,
        study_folder,
        watch.seconds,
        notes,
        extra_section=lambda output: novel_viewpoint_table(jobs, novel_accuracy),
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
