"""A user's mistake gets a short message that names the culprit, never a traceback."""

from __future__ import annotations

import argparse
import math
import signal
import zipfile
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from pydantic import PositiveInt

from capsexp.__main__ import check_group_overrides
from capsexp.callbacks.progress_log import ProgressLog
from capsexp.config.arguments import checked
from capsexp.config.config_check import config_problems
from capsexp.data import SmallNORBDataModule
from capsexp.errors import CheckpointError, ConfigError, InputShapeError, Interrupted
from capsexp.lit import Classifier, CrossEntropy
from capsexp.lit.margin import LinearMargin
from capsexp.lit.schedulers import exponential_decay
from capsexp.locations import CONFIG_DIR
from capsexp.models import BaselineCNN, CapsNet, LeNet5, MatrixCapsNet
from capsexp.nn import EMRouting
from capsexp.records.checkpoints import _LINE_LIMIT, check_checkpoint, model_of_run
from tests.helpers import TINY_EM_CAPS, TINY_RUN, compose_config, run_cli_in_process


def _options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONFIG_DIR / group).glob("*.yaml"))


# ---- the config check ------------------------------------------------------------------------------
# Every model x data pair passes it: tests/test_configs.py, where each pair is also built.


@pytest.mark.parametrize(
    "extra",
    [[f"experiment={name}"] for name in _options("experiment")]
    + [[f"debug={name}"] for name in _options("debug")]
    + [[f"model/margin={name}", "model=em_caps_small"] for name in _options("model/margin")]
    + [[f"model/lr_scheduler={name}"] for name in _options("model/lr_scheduler")]
    + [[f"attack={name}"] for name in _options("attack")]
    + [["model/optimizer=sgd"], ["trainer=cpu"], ["logger=csv"], ["trainer.devices=2", "trainer.accelerator=cpu"]]
    + [["callbacks=[default,stop_at_accuracy]", "callbacks.stop_at_accuracy.stopping_threshold=0.9"]],
)
def test_every_shipped_option_passes_the_check(extra):
    assert config_problems(compose_config(extra)) == []


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["data.batch_size=0"], "data.batch_size=0: must be greater than 0"),
        (["data.batch_size=abc"], "data.batch_size=abc: must be a valid integer"),
        (["data.batch_size=2.5"], "data.batch_size=2.5: must be a valid integer"),
        (["data.batch_size=true"], "data.batch_size=true: must be a valid integer"),
        (
            ["model.optimizer.lr=-0.1"],
            "model.optimizer (Adam: lr=-0.1 betas=[0.9,0.999] weight_decay=0.0 fused=true): "
            "Invalid learning rate: -0.1",
        ),
        (["model.optimizer.lr=nan"], "Invalid learning rate: nan"),
        (["model/optimizer=sgd", "model.optimizer.momentum=-1"], "Invalid momentum value: -1"),
        (["model=capsnet", "model.net.routing.iterations=0"], "model.net.routing.iterations=0: must be greater than 0"),
        (["model=em_caps_small", "model.net.routing.iterations=-1"], "model.net.routing.iterations=-1"),
        (
            ["model=em_caps_small", "model.net.routing.final_lambda=0"],
            "model.net.routing.final_lambda=0: must be greater than 0",
        ),
        (
            ["model=em_caps_small", "model.net.routing.cost_normalization=zscore"],
            "model.net.routing.cost_normalization=zscore: must be 'none', 'data', 'standardize' or 'layer'",
        ),
        (
            ["model=em_caps_small", "model.net.routing.sigma_eps=0"],
            "model.net.routing.sigma_eps=0: must be greater than 0",
        ),
        (["model=em_caps_small", "model.net.routing.learn_inverse_temperature=maybe"], "must be a valid boolean"),
        (["model=em_caps_small", "+model.net.iterations=2"], "model.net.iterations: MatrixCapsNet takes no such"),
        (["model=em_caps_small", "model.net.routing=em"], "model.net.routing=em: must be an instance of Routing"),
        (
            ["model=em_caps_small", "model.margin.unit=epochs"],
            "model.margin.unit=epochs: must be 'epoch', 'step' or 'run'",
        ),
        (["model=baseline_cnn", "model.net.conv_layers=[]"], "model.net.conv_layers=[]: must have at least 1 item"),
        (["model=baseline_cnn", "model.net.dropout=1.0"], "model.net.dropout=1.0: must be less than 1"),
        (["model=capsnet", "model.lr_scheduler.scheduler.decay_rate=0"], "decay_rate=0: must be greater than 0"),
        (["data=rotated_mnist", "data.test_rotations=[0,abc]"], "data.test_rotations=[0,abc]: must be a valid number"),
        (["data=smallnorb", "data.stereo=top"], "data.stereo=top: must be 'both', 'left' or 'split'"),
        (["data=smallnorb", "data.crop_size=64"], "data.crop_size=64: must be at most data.resize=48"),
        (["data.on_device=maybe"], "data.on_device=maybe: must be a valid boolean or 'auto'"),
        (["callbacks.progress_log.when=sometimes"], "must be 'auto', 'always' or 'never'"),
        (["trainer.precision=bf17"], "'bf16-mixed', '32-true' or '64-true' or '64', '32', '16' or 'bf16', or 'auto'"),
        (["trainer.devices=3", "trainer.accelerator=cpu"], "must divide by the 3 processes"),
        (["train=false", "test=false"], "nothing to do"),
        (["seed=abc"], "seed=abc: must be a valid integer"),
        (["float32_matmul_precision=low"], "must be 'highest', 'high' or 'medium'"),
        (["task_name="], "task_name=: must have at least 1 character"),
        (
            ["callbacks=[default,stop_at_accuracy]"],
            "callbacks.stop_at_accuracy.stopping_threshold: needs a value (the config leaves it ???)",
        ),
    ],
)
def test_bad_values_are_named_with_what_is_allowed(overrides, expected):
    problems = config_problems(compose_config(overrides))
    assert len(problems) == 1 and expected in problems[0], problems


class ToyNet(torch.nn.Module):
    """A net with a parameter no rule anywhere names: its type hint alone declares what it allows."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int, depth: PositiveInt = 2) -> None:
        super().__init__()


def test_a_new_parameter_is_checked_from_its_type_hint_alone():
    overrides = ["model.net._target_=tests.test_errors.ToyNet"]
    assert config_problems(compose_config([*overrides, "+model.net.depth=3"])) == []
    assert config_problems(compose_config([*overrides, "+model.net.depth=0"])) == [
        "model.net.depth=0: must be greater than 0"
    ]


def test_constructors_check_their_arguments_when_built_from_python():
    with pytest.raises(ValueError, match=r"^EMRouting: iterations=0: must be greater than 0$"):
        EMRouting(iterations=0)
    with pytest.raises(ValueError, match=r"^MatrixCapsNet: routing=em: must be an instance of Routing$"):
        MatrixCapsNet(routing="em")
    with pytest.raises(ValueError, match=r"^LeNet5: in_channels=0: must be greater than 0$"):
        LeNet5(0)  # positional arguments too
    with pytest.raises(ValueError, match=r"stereo=top: must be 'both', 'left' or 'split'; .*crop_size=2.5"):
        SmallNORBDataModule(stereo="top", crop_size=2.5)
    with pytest.raises(ValueError, match=r"^exponential_decay: decay_steps=0: must be greater than 0$"):
        exponential_decay(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), decay_steps=0)
    with pytest.raises(ValueError, match=r"when=sometimes: must be 'auto', 'always' or 'never'"):
        ProgressLog(when="sometimes")
    assert LinearMargin(unit="step", duration=600).margin(300, 0.0) == pytest.approx(0.55)
    with pytest.raises(ValueError, match=r"^LinearMargin: duration=1.5: must be at most 1 with unit=run"):
        LinearMargin(unit="run", duration=1.5)
    with pytest.raises(ConfigError, match=r"model.margin.unit=run: .* needs the run's length; set trainer.max_steps"):
        LinearMargin(unit="run", duration=0.5).margin(10, 0.0, math.inf)  # a run with no end


def test_group_options_are_checked_before_hydra_composes():
    with pytest.raises(ConfigError, match=r"model=lenet: no such option \(did you mean model=lenet5\?\)"):
        check_group_overrides(["model=capsnet,lenet"], CONFIG_DIR)
    # The options listed are the group's own: not its subgroups (model/routing).
    with pytest.raises(ConfigError, match=r"model is one of: baseline_cnn, capsnet, .*lenet5, vb_caps$") as refused:
        check_group_overrides(["model=routing"], CONFIG_DIR)
    assert "routing" not in str(refused.value).splitlines()[-1]
    check_group_overrides(
        [
            "model=capsnet,lenet5",
            "model/routing=em,em_paper,dynamic",  # the stored options too (capsexp/__init__.py)
            "callbacks=[default,stop_at_accuracy]",  # several options of one group, merged
            "data.batch_size=3",
            "hydra/launcher=joblib",
            "--cfg",
            "job",
            "experiment=null",
            "+extra=1",
        ],
        CONFIG_DIR,
    )
    # What a model's recipe holds is what Hydra composes for it (the bases' groups included).
    check_group_overrides(["model=em_caps_small,em_caps", "model/margin=linear"], CONFIG_DIR)
    with pytest.raises(
        ConfigError,
        match=r"^model/margin=linear: model=lenet5 has no margin .*\(it has: lr_scheduler, net, optimizer\)",
    ):
        check_group_overrides(["model/margin=linear"], CONFIG_DIR)  # the default model
    with pytest.raises(ConfigError, match=r"did you mean hydra/launcher=joblib\?"):
        check_group_overrides(["hydra/launcher=jobllib"], CONFIG_DIR)  # Hydra's own groups too


# ---- the CLI: exit status, no traceback, a few lines naming the culprit ----------------------------
def _corrupt_checkpoints(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "empty.ckpt").write_bytes(b"")
    (folder / "noise.ckpt").write_bytes(bytes(range(256)) * 20)
    torch.save({"weights": torch.zeros(3)}, folder / "plain.pt")
    torch.save(
        {"state_dict": {}, "pytorch-lightning_version": "2.6", "args": argparse.Namespace(a=1)}, folder / "pickled.ckpt"
    )
    # A zip archive that lost a tensor's storage (a copy cut short, a bad disk): the zip itself reads.
    torch.save({"state_dict": {"w": torch.zeros(4)}, "pytorch-lightning_version": "2.6"}, folder / "whole.ckpt")

    def without_storage(name: str, data: bytes) -> bytes | None:
        return None if name.endswith("/data/0") else data

    _copy_archive(folder / "whole.ckpt", folder / "damaged.ckpt", without_storage)
    stateless_run = folder / "run"  # a run folder whose run never saved a checkpoint
    (stateless_run / ".hydra").mkdir(parents=True, exist_ok=True)
    (stateless_run / ".hydra" / "overrides.yaml").write_text("- model=lenet5\n")
    return {
        "stateless_run": stateless_run,
        "missing": folder / "missing.ckpt",
        "folder": folder,
        "empty": folder / "empty.ckpt",
        "noise": folder / "noise.ckpt",
        "plain": folder / "plain.pt",
        "pickled": folder / "pickled.ckpt",
        "damaged": folder / "damaged.ckpt",
    }


BAD_COMMANDS = {
    # name: (overrides, exit status, what the message must name)
    # Values the config check refuses, several to a command (each command costs the imports of torch
    # and Lightning): every one is named, in one message.
    "values refused, CapsNet": (
        [
            "model=capsnet",
            "data=rotated_mnist",
            "model.net.routing.iterations=0",
            "data.batch_size=abc",
            "model.optimizer.lr=-0.001",
            "trainer.precision=bf17",
            "data.test_rotations=[0,abc]",
        ],
        2,
        (
            "model.net.routing.iterations=0",
            "data.batch_size=abc",
            "Invalid learning rate: -0.001",
            "trainer.precision=bf17",
            "data.test_rotations=[0,abc]",
        ),
    ),
    "values refused, EM capsules": (
        [
            "model=em_caps_small",
            "data=smallnorb",
            "model.net.routing.iterations=0",
            "data.stereo=top",
            "data.batch_size=0",
            "attack=fgsm",
            "attack.eps=[0,1.5]",
            "attack.method=cw",
            "test=false",
        ],
        2,
        (
            "model.net.routing.iterations=0",
            "data.stereo=top",
            "data.batch_size=0",
            "attack.eps=[0,1.5]: must be less than or equal to 1 (item 1)",
            "attack.method=cw: must be 'fgsm', 'bim' or 'pgd'",
            "attack: attacks the tested checkpoint; set test=true",
        ),
    ),
    "validation interval out of range": (["trainer.val_check_interval=1.5"], 2, "val_check_interval"),
    "renamed key": (["optimizer.lr=0.01"], 2, "model.optimizer.lr=0.01"),
    "renamed group": (["margin=linear", "model=em_caps_small"], 2, "model/margin=linear"),
    "margin for a loss without one": (["model=capsnet", "+model/margin=linear"], 2, "model.margin"),
    "margin for a model without one": (["model=lenet5", "model/margin=linear"], 2, "model/margin=linear"),
    "batch over processes": (["trainer.devices=3", "trainer.accelerator=cpu"], 2, "data.batch_size=32"),
    "unknown model": (["model=lenet"], 2, "model=lenet"),
    "unknown attack": (["attack=fgms"], 2, "did you mean attack=fgsm?"),
    # Hydra applies a plain attack.* key to a sweep's base config, which has no attack.
    "key of a swept optional group": (["-m", "attack=fgsm,bim", "attack.eps=[0,0.1]"], 2, "++attack.eps=[0,0.1]"),
    # A mistyped key gets the key it meant and what its node has, exit 2, not Hydra's advice to add it.
    "unknown key": (["data.batchsize=3"], 2, ("no such key (did you mean data.batch_size?)", "data has:")),
    "mistyped trainer key": (["trainer.max_epoch=1"], 2, "did you mean trainer.max_epochs?"),
    "key of another option": (
        ["data.root=photos"],
        2,
        ("data.root=photos: no such key", "data is data=mnist; the other options of data:", "image_folder"),
    ),
    "key of an unchosen group": (["attack.eps=0.1"], 2, "no attack is chosen, so it has no key eps; choose one first"),
    "image too small for the net": (
        ["model=capsnet", "geometry.image_size=16"],
        2,
        "CapsNet: image_size=16 is too small",
    ),
    "unknown strategy": (["trainer.accelerator=cpu", "trainer.strategy=bogus"], 2, "trainer.strategy=bogus"),
    # One bad checkpoint file: the message of each kind (empty, noise, not Lightning, pickled objects, a
    # folder) is checked word for word below (check_checkpoint); the command line reports them alike.
    "checkpoint missing": (["train=false", "ckpt_path={missing}"], 1, ("{missing}", "no such file or folder")),
    "run folder without state": (["ckpt_path={stateless_run}"], 1, "checkpoints/last.ckpt is missing"),
    "data dir is a file": (["data.data_dir={noise}"], 1, "{noise}"),
    "data dir without MNIST": (
        ["data.data_dir={folder}", "data.download=false"],
        1,
        ("error: MNIST not found in", "{folder}/MNIST/raw", "data.download=false"),
    ),
}


@pytest.mark.parametrize("name", list(BAD_COMMANDS))
def test_bad_command_lines_get_a_short_error(name, tmp_path):
    overrides, status, named = BAD_COMMANDS[name]
    files = {key: str(path) for key, path in _corrupt_checkpoints(tmp_path / "files").items()}
    # In this process: each command would otherwise spend seconds importing torch and Lightning. The
    # tests below run real processes, so an error's way to the exit status and stderr stays tested.
    result = run_cli_in_process(
        *(o.format(**files) for o in overrides),
        f"hydra.run.dir={tmp_path / 'run'}",
        "callbacks.progress_bar=null",
        "callbacks.model_summary=null",
    )
    message = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == status, result.stderr[-2000:]
    assert "Traceback" not in result.stderr + result.stdout
    assert 1 <= len(message) <= 12, result.stderr
    for culprit in (named,) if isinstance(named, str) else named:
        assert culprit.format(**files) in result.stderr
    assert "weights_only=False" not in result.stderr  # never suggest unpickling an untrusted file


def test_lightnings_own_setting_errors_and_a_missing_checkpoint_are_named_without_a_traceback(mnist_dir, tmp_path):
    """A validation interval beyond the epoch's batches (found by Lightning once the data is known): a few
    lines naming the trainer key, exit 2. A checkpoint that is not there: refused before a run folder is
    made for nothing."""
    result = run_cli_in_process(
        *(o for o in TINY_RUN if o != "callbacks.model_summary=null"),  # the summary as a user's run prints it
        f"paths.data_dir={mnist_dir}",
        "trainer.limit_train_batches=3",
        "trainer.val_check_interval=300",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr + result.stdout
    assert "trainer.val_check_interval" in result.stderr and "do not fit the data" in result.stderr
    printed = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(printed) <= 12, "\n".join(printed)  # the answer, not a table of every layer before it
    result = run_cli_in_process(
        "train=false", f"ckpt_path={tmp_path / 'nothing.ckpt'}", f"hydra.run.dir={tmp_path / 'x'}"
    )
    assert result.returncode == 1 and "no such file or folder" in result.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_a_gpu_asked_for_on_a_machine_without_one_is_a_usage_error(tmp_path):
    result = run_cli_in_process("trainer.accelerator=gpu", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "trainer.accelerator=gpu" in result.stderr


# In a sweep of the basic sweeper (capsexp's resumable one) too: no sweeper there needs the metric.
@pytest.mark.parametrize("sweep", [False, True], ids=["single run", "basic sweep"])
def test_a_run_without_validation_exits_0_warns_and_logs_progress_when_piped(sweep, mnist_dir, tmp_path):
    result = run_cli_in_process(
        *(["-m", f"hydra.sweep.dir={tmp_path}"] if sweep else [f"hydra.run.dir={tmp_path}"]),
        *TINY_RUN,
        f"paths.data_dir={mnist_dir}",
        "trainer.max_steps=5",
        "callbacks.progress_log.interval_s=0.001",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    output = result.stdout + result.stderr
    assert "optimized_metric=val/acc_best was not logged: the run never validated" in output
    # stdout is a pipe here: the plain progress lines stand in for the rich bar.
    progress = [line for line in output.splitlines() if "capsexp.progress" in line]
    assert any("step 5/5 (100.0%)" in line and "img/s" in line and "loss" in line for line in progress), progress
    assert any("training done: 5 steps" in line for line in progress)


def test_an_optuna_job_that_never_validated_fails_and_says_how_to_validate(mnist_dir, tmp_path):
    result = run_cli_in_process(
        *TINY_RUN,
        f"paths.data_dir={mnist_dir}",
        "hparams_search=em_caps_optuna",
        "model=em_caps_small",
        *TINY_EM_CAPS,
        "hydra.sweeper.n_trials=1",
        "trainer.max_steps=2",
        "data.batch_size=20",
        "trainer.limit_test_batches=1",
        f"hydra.sweep.dir={tmp_path}",
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "error: optimized_metric=val/acc_best was not logged: the run never validated" in result.stderr
    assert "trainer.val_check_interval=N" in result.stderr
    # The command it printed to finish the search names the search's folder and its study's storage.
    import shlex

    from capsexp.overrides import value

    said = result.stdout + result.stderr
    line = next(line for line in said.splitlines() if "To finish this search if it is stopped" in line)
    pasted = shlex.split(line.split("or add a worker to it: ", 1)[1])
    given = {a.split("=", 1)[0]: value(a) for a in pasted if a.startswith("hydra.sweep")}
    assert given["hydra.sweep.dir"] == str(tmp_path)
    storage = given["hydra.sweeper.storage"]
    assert storage.startswith("sqlite:///") and Path(storage.removeprefix("sqlite:///")).is_file()


def test_a_misnamed_metric_is_an_error_for_a_sweeper_only(mnist_dir, tmp_path):
    result = run_cli_in_process(
        *TINY_RUN, f"paths.data_dir={mnist_dir}", "debug=fast", "optimized_metric=val/nope", f"hydra.run.dir={tmp_path}"
    )
    assert result.returncode == 0
    assert "optimized_metric=val/nope is not a metric this run logs" in result.stdout + result.stderr


# ---- checkpoints and nets, as a library -----------------------------------------------------------
def test_checkpoint_of_another_model_is_named_as_such(tmp_path):
    def classifier(net):
        return Classifier(net, CrossEntropy(), optimizer=torch.optim.Adam, num_classes=10)

    path = tmp_path / "lenet.ckpt"
    torch.save({"state_dict": classifier(LeNet5()).state_dict(), "pytorch-lightning_version": "2.6"}, path)
    check_checkpoint(path, classifier(LeNet5()))
    with pytest.raises(
        CheckpointError,
        match=r"another model than this run's LeNet5 .*net.features.0.weight is "
        r"\(6, 1, 5, 5\) in the checkpoint, \(6, 2, 5, 5\) in this model",
    ):
        check_checkpoint(path, classifier(LeNet5(in_channels=2)))
    for file in _corrupt_checkpoints(tmp_path / "bad").values():
        with pytest.raises(CheckpointError, match="ckpt_path="):
            check_checkpoint(file)
    damaged = tmp_path / "bad" / "damaged.ckpt"
    with pytest.raises(RuntimeError) as torch_error:  # what torch.load says: quoted by its first line
        torch.load(damaged, map_location="cpu", weights_only=True)
    with pytest.raises(CheckpointError) as error:
        check_checkpoint(damaged)
    first_line = str(torch_error.value).strip().splitlines()[0][:_LINE_LIMIT]
    assert str(error.value) == f"ckpt_path={damaged} is a damaged PyTorch checkpoint ({first_line})"


def _copy_archive(source: Path, target: Path, edit) -> Path:
    """A copy of a torch.save archive whose members are ``edit(name, data)``; None drops a member."""
    with zipfile.ZipFile(source) as whole, zipfile.ZipFile(target, "w") as copy:
        for member in whole.infolist():
            data = edit(member.filename, whole.read(member))
            if data is not None:
                copy.writestr(member, data)
    return target


def _rewrite_pickle(source: Path, target: Path, edit) -> Path:
    """A copy of a torch.save archive whose pickled part is ``edit(bytes)``."""
    return _copy_archive(source, target, lambda name, data: edit(data) if name.endswith("/data.pkl") else data)


LIGHTNING_FILE = {"state_dict": {"w": torch.arange(3.0)}, "pytorch-lightning_version": "2.6"}
NOT_LIGHTNING = (
    "is a PyTorch file but not a Lightning checkpoint (no state_dict or pytorch-lightning_version in it): "
    "give a .ckpt written by a capsexp run"
)


def test_each_bad_checkpoint_gets_its_own_whole_message(tmp_path):
    files = _corrupt_checkpoints(tmp_path)
    torch.save({"state_dict": {}}, tmp_path / "no_version.ckpt")
    torch.save({"pytorch-lightning_version": "2.6"}, tmp_path / "no_state.ckpt")
    torch.save([1, 2], tmp_path / "list.ckpt")
    torch.save(LIGHTNING_FILE, tmp_path / "good.ckpt")
    # A pickle that does not read (a garbage opcode after the protocol header).
    _rewrite_pickle(tmp_path / "good.ckpt", tmp_path / "garbled.ckpt", lambda data: data[:2] + b"g")
    expected = {
        files["missing"]: ": no such file. A run's checkpoints are in logs/<task_name>/runs/<time>/checkpoints/ "
        "(last.ckpt, and the best by val/acc)",
        files["empty"]: " is empty (0 bytes): the run that wrote it stopped while saving?",
        files["noise"]: " is not a PyTorch checkpoint (not in torch.save's format, or truncated)",
        files["plain"]: f" {NOT_LIGHTNING}",
        tmp_path / "no_version.ckpt": f" {NOT_LIGHTNING}",
        tmp_path / "no_state.ckpt": f" {NOT_LIGHTNING}",
        tmp_path / "list.ckpt": f" {NOT_LIGHTNING}",
        files["pickled"]: " holds Python objects other than tensors and plain values. capsexp loads checkpoints "
        "without running code from them and will not load this one; checkpoints written by capsexp never need that.",
        tmp_path / "garbled.ckpt": " is a damaged PyTorch checkpoint (Unsupported operand 103)",
    }
    for path, message in expected.items():
        with pytest.raises(CheckpointError) as error:
            check_checkpoint(path)
        assert str(error.value) == f"ckpt_path={path}{message}"
    for alias in ("last", "best"):  # Lightning resolves these itself
        check_checkpoint(alias)


def test_a_folder_given_as_checkpoint_names_the_checkpoints_in_it(tmp_path):
    for name in ("d", "a", "c", "b"):
        (tmp_path / "flat" / f"{name}.ckpt").parent.mkdir(exist_ok=True)
        (tmp_path / "flat" / f"{name}.ckpt").write_bytes(b"")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "last.ckpt").write_bytes(b"")
    (tmp_path / "nothing").mkdir()
    hints = {"flat": "; it holds a.ckpt, b.ckpt, c.ckpt", "run": "; it holds last.ckpt", "nothing": ""}
    for folder, hint in hints.items():
        with pytest.raises(CheckpointError) as error:
            check_checkpoint(tmp_path / folder)
        assert str(error.value) == f"ckpt_path={tmp_path / folder} is a folder: give a .ckpt file{hint}"


def test_a_checkpoint_written_on_a_gpu_is_checked_on_a_machine_without_one(tmp_path):
    torch.save(LIGHTNING_FILE, tmp_path / "cpu.ckpt")
    on_gpu = _rewrite_pickle(  # the storage's location, as torch.save writes it for a CUDA tensor
        tmp_path / "cpu.ckpt", tmp_path / "gpu.ckpt", lambda data: data.replace(b"X\x03\0\0\0cpu", b"X\x06\0\0\0cuda:0")
    )
    assert b"cuda:0" in zipfile.ZipFile(on_gpu).read("cpu/data.pkl")  # the archive keeps its first name
    check_checkpoint(on_gpu, _module_with(w=(3,)))  # read onto the CPU: no "CUDA is not available"


def _module_with(**shapes: tuple[int, ...]) -> torch.nn.Module:
    module = torch.nn.Module()
    for name, shape in shapes.items():
        module.register_parameter(name, torch.nn.Parameter(torch.zeros(shape)))
    return module


@pytest.mark.parametrize(
    "saved,differ,first",
    [
        ({}, 2, "this model's weight is not in the checkpoint"),
        (
            {"weight": (3, 2), "bias": (3,), "x": (1,), "y": (1,)},
            2,
            "the checkpoint's x is not in this model",
        ),
        (
            {"weight": (2, 3), "x": (1,), "y": (1,)},
            4,
            "weight is (2, 3) in the checkpoint, (3, 2) in this model",
        ),
    ],
    ids=["missing", "unexpected", "all three"],
)
def test_weights_that_do_not_fit_are_counted_and_the_first_named(tmp_path, saved, differ, first):
    """A bare nn.Module (no .net) is named by its own class."""
    path = tmp_path / "other.ckpt"
    state_dict = {name: torch.zeros(shape) for name, shape in saved.items()}
    torch.save({"state_dict": state_dict, "pytorch-lightning_version": "2.6"}, path)
    with pytest.raises(CheckpointError) as error:
        check_checkpoint(path, torch.nn.Linear(2, 3))
    assert str(error.value) == (
        f"ckpt_path={path} was saved from another model than this run's Linear ({differ} weights differ; {first}).\n"
        "Use the model and data options of the run that wrote it (its .hydra/config.yaml, two folders up from "
        "checkpoints/)."
    )


def test_an_unpickling_error_without_the_unpicklers_advice_is_quoted_whole(tmp_path, monkeypatch):
    """torch's weights-only unpickler puts its advice before the cause; an UnpicklingError raised
    elsewhere (another torch release, a plain pickle) has no such part and is quoted from its start."""
    import pickle

    torch.save(LIGHTNING_FILE, tmp_path / "good.ckpt")

    def load(*args, **kwargs):
        raise pickle.UnpicklingError("invalid load key, 'x'.\nmore")

    monkeypatch.setattr(torch, "load", load)  # checkpoints imports torch where it reads
    with pytest.raises(CheckpointError) as error:
        check_checkpoint(tmp_path / "good.ckpt")
    assert (
        str(error.value)
        == f"ckpt_path={tmp_path / 'good.ckpt'} is a damaged PyTorch checkpoint (invalid load key, 'x'.)"
    )


def test_an_underlying_error_is_quoted_by_its_first_line_or_its_type():
    from capsexp.records.checkpoints import _first_line

    assert _first_line("  " + "x" * 200 + "\nsecond line", ValueError()) == "x" * _LINE_LIMIT
    assert _first_line(" \n ", KeyError()) == "KeyError"


@pytest.mark.parametrize(
    "net,name,built",
    [
        (LeNet5(), "LeNet5", "1x28x28"),
        (BaselineCNN(conv_layers=[4], hidden_sizes=[4]), "BaselineCNN", "1x28x28"),
        (CapsNet(), "CapsNet", "1x28x28"),
        (
            MatrixCapsNet(
                conv_channels=8, primary_types=4, conv_caps1_types=4, conv_caps2_types=4, in_channels=2, image_size=32
            ),
            "MatrixCapsNet",
            "2x32x32",
        ),
    ],
)
def test_nets_name_both_sizes_for_images_of_another_size(net, name, built):
    with pytest.raises(InputShapeError, match=f"{name} was built for images of {built} .* got 1x40x40"):
        net(torch.rand(2, 1, 40, 40))


def test_a_run_stopped_by_a_signal_exits_with_the_shells_status_for_it():
    for signum, status in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        error = Interrupted("stopped: resume with ...", signum)
        assert error.exit_code == status and str(error) == "stopped: resume with ..."


def test_checked_guards_a_function_and_a_class_alike():
    """``checked`` applied here, as a user's own code would: each bad argument named with what it allows,
    positional or by keyword; good calls pass through."""

    def scaled(value: PositiveInt, factor: float = 2.0) -> float:
        return value * factor

    class Box:
        def __init__(self, size: PositiveInt, label: str = "box") -> None:
            self.size, self.label = size, label

    guarded, GuardedBox = checked(scaled), checked(Box)
    assert guarded(3) == 6.0 and guarded(3, factor=0.5) == 1.5 and guarded.__name__ == "scaled"
    assert GuardedBox is Box and GuardedBox(4, label="b").size == 4
    with pytest.raises(ValueError, match=r"^scaled: value=0: must be greater than 0$"):
        guarded(0)
    with pytest.raises(ValueError, match=r"^Box: size=-1: must be greater than 0$"):
        GuardedBox(size=-1)


def test_a_value_that_cannot_be_resolved_is_named_with_the_first_line_of_the_reason():
    problems = config_problems(compose_config(["model=lenet5", "model.net.in_channels=${no_such_key}"]))
    assert problems == ["model.net.in_channels: cannot be resolved (Interpolation key 'no_such_key' not found)"]


def test_the_model_of_a_run_is_built_from_its_config_with_its_weights_or_named_errors(tmp_path):
    """model_of_run (a black-box attack's source): the run's own config builds the model and the
    checkpoint's weights fill it; what goes wrong is named by the key the user gave."""
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / "checkpoints").mkdir()
    cfg = compose_config(["model=lenet5"])
    OmegaConf.save(cfg, run / ".hydra" / "config.yaml")
    trained = instantiate(cfg.model, _convert_="partial")
    with torch.no_grad():
        for parameter in trained.parameters():
            parameter.normal_()
    checkpoint = run / "checkpoints" / "best.ckpt"
    torch.save({"state_dict": trained.state_dict(), "pytorch-lightning_version": "2.6.0"}, checkpoint)
    source = model_of_run(checkpoint, "attack.source=X")
    assert source.config == OmegaConf.load(run / ".hydra" / "config.yaml")
    assert all(torch.equal(source.module.state_dict()[k], v) for k, v in trained.state_dict().items())
    assert (source.file, source.record, source.note) == (checkpoint, None, None)
    # Its run folder: the checkpoint the run recorded as best, else the newest beside last.ckpt, said so.
    from_folder = model_of_run(run, "attack.source=X")
    assert from_folder.file == checkpoint and "best.ckpt, its newest checkpoint" in from_folder.note
    # Weights of another model: named, not PyTorch's size-mismatch traceback.
    other = instantiate(compose_config(["model=baseline_cnn"]).model)
    torch.save({"state_dict": other.state_dict(), "pytorch-lightning_version": "2.6.0"}, checkpoint)
    with pytest.raises(CheckpointError, match=r"^attack\.source=X was saved from another model than this run's LeNet5"):
        model_of_run(checkpoint, "attack.source=X")
    # A config that cannot build its model says which key led there.
    OmegaConf.save(compose_config(["model=lenet5", "model.net.in_channels=0"]), run / ".hydra" / "config.yaml")
    with pytest.raises(
        ConfigError, match=r"in_channels=0: must be greater than 0\n  raised building attack\.source=X \("
    ):
        model_of_run(checkpoint, "attack.source=X")
    loose = tmp_path / "loose.ckpt"  # a checkpoint without its run's record, outside a run folder
    loose.write_bytes(checkpoint.read_bytes())
    with pytest.raises(CheckpointError) as error:
        model_of_run(loose, "attack.source=X")
    assert str(error.value) == (
        f"attack.source=X: no run config at {tmp_path.parent / '.hydra' / 'config.yaml'}. The checkpoint must "
        "sit inside the folder of the run that wrote it (<run>/checkpoints/*.ckpt): its .hydra/config.yaml builds "
        "its model."
    )


def test_more_cpu_processes_than_cores_are_warned_about(caplog):
    import os

    import lightning as L

    from capsexp.run.trainer import _warn_if_more_processes_than_cores

    cores = os.cpu_count() or 1
    trainer = L.Trainer(accelerator="cpu", devices=cores + 1, strategy="ddp", logger=False, enable_progress_bar=False)
    with caplog.at_level("WARNING", logger="capsexp.run.trainer"):
        _warn_if_more_processes_than_cores(trainer)
    assert f"trainer.devices={cores + 1} runs {cores + 1} processes on {cores} CPU cores" in caplog.text
    one = L.Trainer(accelerator="cpu", devices=1, logger=False)
    caplog.clear()
    with caplog.at_level("WARNING", logger="capsexp.run.trainer"):
        _warn_if_more_processes_than_cores(one)
    assert "CPU cores" not in caplog.text
