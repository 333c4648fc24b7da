"""Studies as experiment configs: every budget composes and sweeps what it says, the paper's and the
expected figures name configurations the sweep makes, a study runs from the command line and ends with
its page, the user's overrides win, and a wrong budget is a short error."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from capsexp.config import hydra_setup
from capsexp.locations import CONFIG_DIR
from capsexp.records.events import load_events
from capsexp.results.study import figure_for, load_study_page
from capsexp.studies.sabour2017 import CONVERGENCE, RoutingConvergence
from tests.helpers import PROJECT_ROOT, TINY_RUN, required_choices, run_cli_in_process

EXPERIMENTS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))
STUDIES = [name for name in EXPERIMENTS if "budgets" in OmegaConf.load(CONFIG_DIR / "experiment" / f"{name}.yaml")]


def sweep_jobs(cfg) -> list[list[str]]:
    """The overrides of each job of the multirun ``cfg`` (composed with its Hydra config) launches: its
    ``hydra.sweeper.params`` expanded as Hydra's basic sweeper does, the product of the values."""
    params = OmegaConf.to_container(cfg.hydra.sweeper.params, resolve=True)
    choices = [[f"{key}={value}" for value in str(values).split(",")] for key, values in params.items()]
    return [list(job) for job in itertools.product(*choices)]


@pytest.mark.parametrize("name", STUDIES)
def test_every_budget_of_a_study_composes_and_its_figures_name_configurations_it_runs(name):
    budgets = list(OmegaConf.load(CONFIG_DIR / "experiment" / f"{name}.yaml").budgets)
    assert "full" in budgets and "quick" in budgets  # the default budget and a CPU sitting
    for budget in budgets:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            hydra_setup.register()
            overrides = [f"experiment={name}", f"study={budget}", *required_choices(name)]
            cfg = compose("config", overrides=overrides, return_hydra_config=True)
            HydraConfig.instance().set_config(cfg)
            try:
                for node in ("trainer", "data", "model"):  # every ${budgets.${study}...} resolves
                    OmegaConf.to_container(cfg[node], resolve=True)
                jobs = sweep_jobs(cfg)
            finally:
                HydraConfig.instance().cfg = None  # no Hydra run for the tests that follow in this process
        assert cfg.task_name == name
        assert len(jobs) >= 2
        page = load_study_page(name, budget)
        assert page.title and page.notes, f"{name}: the page says what the {budget} budget runs"
        for key in page.paper.figures if page.paper else {}:  # a key that matches no job is a typo
            assert any(figure_for({key: 0}, job) is not None for job in jobs), f"{name}: {key} matches no job"
        choices = [{o.lower() for o in job if not o.startswith("seed=")} for job in jobs]
        for key in page.expected.figures if page.expected else {}:  # names a job's choices, all of them
            assert {part.lower() for part in key.split()} in choices, f"{name}: {key} is no job's choices"
        for reference in page.references:
            assert any(figure_for({reference: 0}, job) is not None for job in jobs), f"{name}: {reference} is no job"


def run_multirun(*arguments: str) -> subprocess.CompletedProcess:
    """``python -m capsexp -m <arguments>`` from the repository, with the tests' tiny run settings."""
    return subprocess.run(
        [sys.executable, "-m", "capsexp", "-m", *TINY_RUN, *arguments],  # the arguments win
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_a_study_runs_from_the_command_line_and_ends_with_its_page(mnist_dir, tmp_path):
    """The routing ablation of the dynamic-routing paper on small synthetic MNIST: four configurations,
    the user's seed and tiny budget winning over the study's, and the page beside the runs with the
    paper's errors."""
    sweep = tmp_path / "sweep"
    result = run_cli_in_process(
        "-m",
        *TINY_RUN,
        "experiment=dr_mnist",
        "study=quick",
        "seed=5",
        f"data.data_dir={mnist_dir}",
        "trainer.limit_train_batches=2",
        "model.net.conv_channels=16",
        "model.net.primary_types=4",
        f"hydra.sweep.dir={sweep}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(jobs) == 4
    overrides = [yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()) for job in jobs]
    assert all("seed=5" in o and "study=quick" in o for o in overrides)  # the command line wins
    assert {(o[0], o[1]) for o in overrides} == {
        (f"model.net.routing.iterations={i}", f"model.net.reconstruction={r}") for i in (1, 3) for r in (True, False)
    }
    page = (sweep / "README.md").read_text()
    assert page.startswith("# Routing iterations and reconstruction (CapsNet, the dynamic-routing paper's Table 1)")
    assert "| paper: test error (%) |" in page and "| 0.25 ± 0.005 |" in page and "| 0.34 ± 0.032 |" in page
    assert "## Against `model.net.routing.iterations=3 model.net.reconstruction=True`" in page
    assert "Comparison of the runs:" in result.stderr + result.stdout
    # After the sweep, each run's routing traced for 10 iterations (the paper's Appendix A) into its events.
    settles = page.split("## How routing settles (the paper's Appendix A)")[1]
    assert [int(r) for r in re.findall(r"^\| (\d+) \|", settles, re.MULTILINE)] == list(range(2, 11))
    traces = sorted(sweep.rglob(f"*.{CONVERGENCE}"))
    assert len(traces) == 4
    for job in jobs:  # logged at the run's last time: the run's span stays its training's
        events = load_events(job)
        last = {tag: events.Scalars(tag)[-1].wall_time for tag in events.Tags()["scalars"]}
        traced = [time for tag, time in last.items() if tag.startswith(CONVERGENCE)]
        assert traced and max(traced) <= max(time for tag, time in last.items() if not tag.startswith(CONVERGENCE))
    hydra_setup.register()
    RoutingConvergence()(sweep)  # again, as when the page is remade: nothing traced twice
    assert sorted(sweep.rglob(f"*.{CONVERGENCE}")) == traces


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["experiment=dr_mnist", "study=quik"],
            "study=quik: experiment=dr_mnist has no such budget (its budgets are: ",
        ),
        (["study=quick"], "study=quick chooses the budget of an experiment config: add experiment=<name>, one of: "),
        (["experiment=lenet5_mnist", "study=quick"], "experiment=lenet5_mnist has no such budget (it has no budgets)"),
        # A sweep over experiments: each is checked, the one lacking the budget named (here the second).
        (
            ["-m", "experiment=dr_mnist,lenet5_mnist", "study=quick"],
            "experiment=lenet5_mnist has no such budget (it has no budgets)",
        ),
    ],
)
def test_a_budget_the_experiment_lacks_is_a_short_error(arguments, message):
    result = subprocess.run(
        [sys.executable, "-m", "capsexp", *arguments], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


# Where a job writes (task_name names its log folder), and what its page says: not what it runs.
IGNORED_KEYS = ("hydra", "paths", "task_name", "budgets", "page", "study", "tags")


def composed_job(overrides: list[str]) -> dict:
    """The job config ``overrides`` compose to, resolved, without what only says where things go."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        hydra_setup.register()
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
        cfg.hydra.runtime.output_dir = "run"
        HydraConfig.instance().set_config(cfg)
        with open_dict(cfg):
            del cfg["hydra"]
        try:
            job = OmegaConf.to_container(cfg, resolve=True)
        finally:
            HydraConfig.instance().cfg = None
    job["callbacks"].pop("progress_bar", None)  # how the console looked
    return {key: value for key, value in job.items() if key not in IGNORED_KEYS}


# One job per row folder of each page's runs; the other jobs of a row differ from it by their seed alone.
ROWS_OF_FORMER_DRIVERS = sorted(
    {
        p.parent.parent.parent
        for p in (PROJECT_ROOT / "experiments" / "results").glob("*/runs/**/.hydra/overrides_as_run.yaml")
    }
)


@pytest.mark.parametrize(
    "row", ROWS_OF_FORMER_DRIVERS, ids=[str(p.relative_to(PROJECT_ROOT)) for p in ROWS_OF_FORMER_DRIVERS]
)
def test_committed_runs_of_a_former_driver_compose_as_their_experiment_config_runs_them(row):
    """Runs made by a study driver before its experiment config existed keep their overrides in
    ``overrides_as_run.yaml``; ``overrides.yaml`` holds the experiment config's, which must compose the
    same job (so that the page labels them as the config runs them, and a re-run reproduces them)."""

    def without_seed(path):
        return [o for o in yaml.safe_load(path.read_text()) if not o.startswith("seed=")]

    jobs = sorted(p.parent.parent for p in row.glob("*/.hydra/overrides_as_run.yaml"))
    for job in jobs[1:]:
        for name in ("overrides.yaml", "overrides_as_run.yaml"):
            assert without_seed(job / ".hydra" / name) == without_seed(jobs[0] / ".hydra" / name)
    overrides = yaml.safe_load((jobs[0] / ".hydra" / "overrides.yaml").read_text())
    original = yaml.safe_load((jobs[0] / ".hydra" / "overrides_as_run.yaml").read_text())
    # They ran where bf16 is native (a CPU with AVX-512 BF16): ${bf16_if_native:} as it resolved there.
    OmegaConf.register_new_resolver("bf16_if_native", lambda: "bf16-mixed", replace=True)
    try:
        assert composed_job(overrides) == composed_job(original)
    finally:
        OmegaConf.register_new_resolver("bf16_if_native", hydra_setup.bf16_if_native, replace=True)


@pytest.mark.slow  # four runs, one of them a black-box attack in a child process (about 35 s): make test-all
def test_the_adversarial_study_attacks_every_net_and_the_capsule_nets_from_lenet5(mnist_dir, tmp_path):
    """em_adversarial on small synthetic MNIST, two nets: each run attacks its own checkpoint (BIM, FGSM
    beside it), then the black-box step attacks CapsNet with LeNet5's examples, and the page tables it."""
    sweep = tmp_path / "sweep"
    result = run_multirun(
        "experiment=em_adversarial",
        "study=quick",
        "+arm/net=lenet5,capsnet",
        "attack.max_images=10",
        "attack.eps=[0,0.1]",
        f"data.data_dir={mnist_dir}",
        "trainer.max_steps=3",
        "trainer.val_check_interval=3",  # validated once: a best checkpoint to attack
        f"hydra.sweep.dir={sweep}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # CapsNet's job, named as its folder in the sweep; LeNet5 is the source
    assert sorted(p.name for p in (sweep / "blackbox").iterdir()) == ["+arm.net=capsnet"]
    page = (sweep / "README.md").read_text()
    table = page[page.index("## Accuracy (%) under attack") :]
    rows = {tuple(line.split(" | ")[:2]) for line in table.splitlines() if line.startswith("| +arm/net=")}
    assert rows == {
        ("| +arm/net=lenet5", "bim"),
        ("| +arm/net=lenet5", "fgsm"),
        ("| +arm/net=capsnet", "bim"),
        ("| +arm/net=capsnet", "fgsm"),
        ("| +arm/net=capsnet train=false", "bim_blackbox"),
        ("| +arm/net=capsnet train=false", "fgsm_blackbox"),
    }
    assert "| eps 0 | eps 0.1 | zero input gradients (%) | input positions never seen (%) |" in table


@pytest.mark.slow  # six runs in child processes (about a minute): make test-all
def test_the_novel_viewpoint_study_matches_the_capsules_to_the_cnn_and_tests_each_on_novel_views(tmp_path):
    """em_novel_viewpoints on small smallNORB files in the official format: LeNet5 per protocol, then a
    tiny EM capsule net stopped at LeNet5's best, then each tested on the novel viewpoints."""
    from tests.helpers import TINY_EM_CAPS, write_norb

    sweep = tmp_path / "sweep"
    quoted = ",".join(f"'{o}'" for o in ["trainer.max_epochs=2", *TINY_EM_CAPS])
    tiny_capsules = [f"++after_sweep.0.overrides=[{quoted}]"]  # the capsule step's own budget
    result = run_multirun(
        "experiment=em_novel_viewpoints",
        "study=quick",
        f"data.data_dir={write_norb(tmp_path / 'data')}",
        "data.verify_checksums=false",
        "data.val_size=12",
        "data.batch_size=12",
        "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=2",
        *tiny_capsules,
        f"hydra.sweep.dir={sweep}",
    )
    assert result.returncode == 0, result.stderr[-3000:]

    def runs_under(pattern: str) -> int:
        return len({events.parent for events in sweep.glob(f"{pattern}/events.out.tfevents.*")})

    assert runs_under("capsules/*") == 2 and runs_under("novel/**") == 4
    page = (sweep / "README.md").read_text()
    rows = [
        line.split(" | ")
        for line in page[page.index("## Novel viewpoints") :].splitlines()
        if line.startswith("| lenet5 |") or line.startswith("| em_caps_small |")
    ]
    assert sorted((row[0], row[1]) for row in rows) == [
        ("| em_caps_small", "azimuth"),
        ("| em_caps_small", "elevation"),
        ("| lenet5", "azimuth"),
        ("| lenet5", "elevation"),
    ]
    assert all(
        row[5] in ("(the CNN)", "yes", "no: budget ended first") and row[7] for row in rows
    )  # a novel error each
    assert any(row[-1] == "3.7; 20.0 / 13.5 |" for row in rows)


def test_the_black_box_step_attacks_each_target_run_with_the_sources_checkpoint_of_its_seed(tmp_path, monkeypatch):
    """capsexp.studies.adversarial.BlackBox on a sweep's folders: one test-only run per target run (its
    own overrides, its best checkpoint, the source's of the same seed as attack.source), none for the
    source itself or for a net that is no target."""
    from torch.utils.tensorboard import SummaryWriter

    from capsexp.studies import adversarial

    sweep = tmp_path / "sweep"
    jobs = {
        "0": ("+arm/net=lenet5", 1),
        "1": ("+arm/net=capsnet", 1),
        "2": ("+arm/net=capsnet", 2),
        "3": ("+arm/net=baseline_cnn", 1),
    }
    for job, (arm, seed) in jobs.items():
        run = sweep / job
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "overrides.yaml").write_text(
            yaml.safe_dump([arm, f"seed={seed}", "experiment=em_adversarial", f"hydra.sweep.dir={sweep}"])
        )
        (run / "checkpoints").mkdir()
        for name in ("last.ckpt", f"epoch_000-step_00000{job}.ckpt"):
            (run / "checkpoints" / name).write_text("weights")
        with SummaryWriter(str(run / "tensorboard")) as writer:
            writer.add_scalar("test/acc", 0.5, 0)
    commands = []
    monkeypatch.setattr(adversarial.subprocess, "run", lambda command, **kwargs: commands.append(command[3:]))
    adversarial.BlackBox("+arm/net=lenet5", ["+arm/net=capsnet", "+arm/net=em_caps"])(sweep)
    assert commands == [
        [
            "+arm/net=capsnet",
            "seed=1",
            "experiment=em_adversarial",
            "train=false",
            f"ckpt_path={sweep / '1' / 'checkpoints' / 'epoch_000-step_000001.ckpt'}",
            f"++attack.source={sweep / '0' / 'checkpoints' / 'epoch_000-step_000000.ckpt'}",
            f"hydra.run.dir={sweep / 'blackbox' / '1'}",
        ]
    ]  # seed 2 has no LeNet5 run to craft its examples: not attacked


def test_the_attack_table_gives_each_attack_per_eps_white_box_first(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from capsexp.results.runs import find_runs, label_configurations
    from capsexp.studies.adversarial import attack_table

    for job, (arm, name, accuracies) in enumerate(
        [
            ("+arm/net=capsnet", "bim", [0.9, 0.5]),
            ("+arm/net=capsnet", "bim_blackbox", [0.9, 0.7]),
            ("+arm/net=lenet5", "bim", [0.95, 0.1]),
        ]
    ):
        run = tmp_path / str(job)
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "overrides.yaml").write_text(
            yaml.safe_dump([arm, *(["train=false"] if "blackbox" in name else [])])
        )
        with SummaryWriter(str(run / "tensorboard")) as writer:
            for eps_step, accuracy in zip((0, 100), accuracies, strict=True):  # eps 0 and 0.1, as capsexp logs them
                writer.add_scalar(f"attack/{name}/acc", accuracy, eps_step)
                writer.add_scalar(f"attack/{name}/fgsm_acc", accuracy + 0.05, eps_step)
            writer.add_scalar(f"attack/{name}/zero_gradient_fraction", 0.25, 0)
    runs = find_runs(tmp_path)
    label_configurations(runs)
    rows = [line for line in attack_table(runs, None, tmp_path).splitlines() if line.startswith("| +arm")]
    assert rows == [
        "| +arm/net=capsnet | bim | 90.00 | 50.00 | 25.00 |  |",
        "| +arm/net=lenet5 | bim | 95.00 | 10.00 | 25.00 |  |",
        "| +arm/net=capsnet | fgsm | 95.00 | 55.00 |  |  |",
        "| +arm/net=lenet5 | fgsm | 100.00 | 15.00 |  |  |",
        "| +arm/net=capsnet train=false | bim_blackbox | 90.00 | 70.00 | 25.00 |  |",
        "| +arm/net=capsnet train=false | fgsm_blackbox | 95.00 | 75.00 |  |  |",
    ]
