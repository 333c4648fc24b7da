"""EM capsules on smallNORB (Hinton, Sabour & Frosst 2018): the paper's configuration, and the
novel-viewpoint experiments (section 5.1, Table 2) against a CNN baseline, at matched accuracy.

    python experiments/em_smallnorb.py --quick      # em_caps_small, 300 steps per epoch
    python experiments/em_smallnorb.py              # em_caps (A=B=C=D=32), 50 epochs per run

1. ``model=em_caps data=smallnorb``: all viewpoints, seeds 1 and 2.
2. Novel viewpoints, as the paper compares them: for each protocol (``data.viewpoint=azimuth``,
   azimuths 300-40°, or ``elevation``, the 3 lowest), the CNN (LeNet5) is trained on the training
   viewpoints first; the EM capsule net is then trained on them until its validation accuracy reaches
   the CNN's best (``callbacks=[default,stop_at_accuracy]``, Lightning's EarlyStopping with
   ``stopping_threshold``) or its budget ends. Each net is tested on the familiar viewpoints and, from
   the same best checkpoint, on the novel ones.

Runs only where smallNORB is present (<data dir>/smallnorb/, the six official files); otherwise it
says what is missing and exits without running anything. Writes experiments/results/em_smallnorb_<mode>/.
"""

from __future__ import annotations

import sys
from pathlib import Path

from capsexp import PROJECT_ROOT
from capsexp.errors import CapsexpError
from capsexp.results.events import last_scalar
from capsexp.results.metric_names import TEST_ACC, VAL_ACC_BEST
from studylib import checkpoint_test_overrides, job_folders, job_overrides, parse_args, run_main
from timing import Stopwatch

STUDY = "em_smallnorb"

QUICK = ["trainer.max_epochs=1", "trainer.limit_train_batches=300", "trainer.limit_val_batches=16"]
FULL = ["trainer.max_epochs=50"]
# The capsule net's budget on the familiar viewpoints: up to three times the CNN's, validated often
# enough that it stops near the CNN's accuracy.
CAPSULE_QUICK = [
    "trainer.max_epochs=3",
    "trainer.limit_train_batches=300",
    "trainer.limit_val_batches=16",
    "trainer.val_check_interval=50",
]
CAPSULE_FULL = ["trainer.max_epochs=150"]
CNN = "lenet5"
VIEWPOINTS = ("azimuth", "elevation")
# The paper's Table 2, test error (%): the familiar viewpoints' (both nets matched there), then the novel
# viewpoints' for the CNN and for the capsule net.
PAPER_TABLE_2 = {"azimuth": (3.7, 20.0, 13.5), "elevation": (4.3, 17.8, 12.3)}
# EarlyStopping stops above its threshold (strictly): just below the CNN's accuracy, so that reaching it counts.
MATCH_TOLERANCE = 1e-6


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


def overrides_of(job: Path) -> dict[str, str]:
    return dict(o.split("=", 1) for o in job_overrides(job))


def novel_viewpoint_table(jobs: list[Path], novel_accuracy: dict[Path, float], thresholds: dict[str, float]) -> str:
    lines = [
        "## Novel viewpoints",
        "",
        "Test error (%) of each run's best checkpoint on the viewpoints it was trained on and on the "
        "others. The capsule net trains until its validation accuracy reaches the CNN's best (the "
        "threshold) or its budget ends, as the paper matches the two nets on familiar viewpoints; "
        "the paper's column is its Table 2 (smallNORB, its own CNN, full training).",
        "",
        "| model | viewpoint | seed | threshold (val acc, %) | best val acc (%) | matched | familiar error "
        "| novel error | paper: familiar error; novel error CNN / capsules |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | --- |",
    ]
    for job in jobs:
        overrides = overrides_of(job)
        viewpoint, is_cnn = overrides["data.viewpoint"], overrides["model"] == CNN
        threshold = thresholds[viewpoint]
        best = last_scalar(job, VAL_ACC_BEST)
        matched = (
            "(the CNN)" if is_cnn else ("yes" if best >= threshold - MATCH_TOLERANCE else "no: budget ended first")
        )
        familiar_paper, cnn_paper, capsules_paper = PAPER_TABLE_2[viewpoint]
        lines.append(
            f"| {overrides['model']} | {viewpoint} | {overrides.get('seed', '')} | {100 * threshold:.2f} | "
            f"{100 * best:.2f} | {matched} | {100 * (1 - last_scalar(job, 'test/acc')):.2f} | "
            f"{100 * (1 - novel_accuracy[job]):.2f} | {familiar_paper}; {cnn_paper} / {capsules_paper} |"
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
    familiar = study_folder / "familiar_viewpoints"
    with Stopwatch() as watch:
        _, command = study.multirun(
            [f"model={model}", "data=smallnorb", "seed=1,2", *budget],
            folder=study_folder / "all_viewpoints",
        )
        commands.append(command)
        protocol = ["data=smallnorb", "data.familiar=true", "seed=1"]
        cnn_folder, command = study.multirun(
            [f"model={CNN}", f"data.viewpoint={','.join(VIEWPOINTS)}", *protocol, *budget], folder=familiar / "cnn"
        )
        commands.append(command)
        jobs = job_folders(cnn_folder)
        thresholds = {overrides_of(job)["data.viewpoint"]: last_scalar(job, VAL_ACC_BEST) for job in jobs}
        for viewpoint, threshold in thresholds.items():
            capsule_folder, command = study.multirun(
                [
                    f"model={model}",
                    f"data.viewpoint={viewpoint}",
                    *protocol,
                    "callbacks=[default,stop_at_accuracy]",
                    f"callbacks.stop_at_accuracy.stopping_threshold={threshold - MATCH_TOLERANCE:.7f}",
                    *(CAPSULE_QUICK if study.quick else CAPSULE_FULL),
                ],
                folder=familiar / f"capsules_{viewpoint}",
            )
            commands.append(command)
            jobs += job_folders(capsule_folder)
        novel_accuracy = {}
        for job in jobs:
            # Beside the study's folder, not in it: capsexp.compare of that folder lists training runs.
            novel_dir = study_folder.with_name(f"{study_folder.name}_novel_viewpoints") / job.parent.name / job.name
            commands.append(
                study.run_capsexp(
                    [
                        *checkpoint_test_overrides(job, "data.familiar="),
                        "data.familiar=false",
                        f"task_name={STUDY}",
                        "callbacks.progress_bar=null",
                        f"hydra.run.dir={novel_dir}",
                    ],
                )
            )
            novel_accuracy[job] = last_scalar(novel_dir, TEST_ACC)
    notes = f"""
smallNORB: 5 categories, stereo pairs downsampled to 48x48, random 32x32 crops with brightness and
contrast jitter in training, centre crops in testing. Model `{model}`; training budget
`{" ".join(budget)}` (the CNN `{CNN}` the same), the capsule net on familiar viewpoints at most
`{" ".join(CAPSULE_QUICK if study.quick else CAPSULE_FULL)}`, stopped at the CNN's best validation
accuracy. Below the novel-viewpoint table, `capsexp.compare` of every training run: on all
viewpoints, and on the training viewpoints of each protocol (tested on those).
"""
    study.write_results(
        "EM capsules on smallNORB",
        commands,
        study_folder,
        watch.seconds,
        notes,
        extra_section=lambda output: novel_viewpoint_table(jobs, novel_accuracy, thresholds),
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
