"""A trained model as an outsider uses it: a sweep's job folder typed as capsexp printed it (``=`` and ``,`` in
its name, absolute or relative) works for predict, export, ``train=false`` and ``capsexp.load``; a run folder
means the checkpoint Lightning recorded as best; a lone ``.ckpt`` is tested without ``model=``; the model
card's command runs as printed; and none of these rewrites a byte of the trained run."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

import capsexp
from capsexp.locations import LAST_CHECKPOINT, OVERRIDES, RUN_RECORD
from capsexp.records.checkpoints import best_checkpoint, checkpoint_of
from tests.helpers import PROJECT_ROOT, TINY_RUN, run_cli_in_process, scalars, write_mnist

TINY_CAPSNET = ["model=capsnet_small", "model.net.conv_channels=16", "model.net.primary_types=4"]


def predict_cli(*overrides: str):
    from capsexp.predict import cli

    return run_cli_in_process(*overrides, entry=cli)


def export_cli(*overrides: str):
    from capsexp.export import cli

    return run_cli_in_process(*overrides, entry=cli)


def recorded_best(run: Path) -> Path:
    """The checkpoint Lightning recorded as best, read here from last.ckpt's ModelCheckpoint state."""
    state = torch.load(run / LAST_CHECKPOINT, map_location="cpu", weights_only=True)["callbacks"]
    (best,) = [s["best_model_path"] for name, s in state.items() if "Checkpoint" in name]
    return run / "checkpoints" / Path(best).name


def hashes(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny CapsNet trained for 6 steps, validated 3 times, its 3 best checkpoints kept, in a folder
    named as a sweep's job folder: the folder and the data's."""
    root = tmp_path_factory.mktemp("trained")
    data_dir = write_mnist(root / "data")
    folder = root / "multiruns" / "2026-11-29_01-00-00" / "model=capsnet_small,seed=1"
    result = run_cli_in_process(
        *TINY_RUN,
        *TINY_CAPSNET,
        "seed=1",
        f"paths.data_dir={data_dir}",
        "trainer.max_steps=6",
        "trainer.val_check_interval=2",
        "callbacks.model_checkpoint.save_top_k=3",
        f"hydra.run.dir={folder}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert len([p for p in (folder / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt"]) == 3
    return folder, data_dir


@pytest.mark.slow
def test_a_job_folder_as_printed_works_everywhere_and_its_files_stay_as_they_were(job, tmp_path):
    folder, data_dir = job
    before = hashes(folder)
    best = recorded_best(folder)
    card = (folder / "model_card.md").read_text()
    assert f"checkpoints/{best.name}` (the best by val/acc)" in card  # what the run itself tested
    digit = tmp_path / "digit.png"
    Image.new("L", (28, 28), 0).save(digit)
    relative = os.path.relpath(folder, Path.cwd())
    for number, given in enumerate([str(folder), relative]):
        predicted = predict_cli(f"ckpt_path={given}", f"images={digit}", f"hydra.run.dir={tmp_path / f'p{number}'}")
        assert predicted.returncode == 0, predicted.stderr[-2000:]
        assert best.name in (tmp_path / f"p{number}" / "summary.md").read_text()
    exported = export_cli(f"ckpt_path={relative}", "check_images=4", f"hydra.run.dir={tmp_path / 'export'}")
    assert exported.returncode == 0, exported.stderr[-2000:]
    tested = run_cli_in_process(
        "train=false",
        f"ckpt_path={relative}",
        f"paths.data_dir={data_dir}",
        "trainer.limit_test_batches=2",
        f"hydra.run.dir={tmp_path / 'tested'}",
    )
    assert tested.returncode == 0, tested.stderr[-3000:]
    assert "test/acc" in scalars(tmp_path / "tested")
    test_card = (tmp_path / "tested" / "model_card.md").read_text()
    assert hashlib.sha256(best.read_bytes()).hexdigest() in test_card and "trained by another run" in test_card
    attacked = run_cli_in_process(
        "train=false",
        f"ckpt_path={folder}",
        "attack=fgsm",
        f"paths.data_dir={data_dir}",
        "trainer.limit_test_batches=1",
        f"hydra.run.dir={tmp_path / 'attacked'}",
    )
    assert attacked.returncode == 0, attacked.stderr[-3000:]
    assert capsexp.load(relative).checkpoint.resolve() == best.resolve()
    assert hashes(folder) == before  # not a byte of the trained run rewritten
    assert "train=false" not in (folder / OVERRIDES).read_text()


def test_a_lone_checkpoint_is_tested_as_the_model_it_recorded_without_model(job, tmp_path):
    folder, data_dir = job
    lone = tmp_path / "elsewhere" / "capsnet.ckpt"
    lone.parent.mkdir()
    shutil.copy(recorded_best(folder), lone)
    record = torch.load(lone, map_location="cpu", weights_only=True)[RUN_RECORD]
    assert "model=capsnet_small" in record["overrides"]
    result = run_cli_in_process(
        "train=false",
        f"ckpt_path={lone}",
        f"paths.data_dir={data_dir}",
        "trainer.limit_test_batches=1",
        f"hydra.run.dir={tmp_path / 'tested'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "CapsNet: " in result.stderr + result.stdout + (tmp_path / "tested" / "capsexp.log").read_text()


def test_the_model_cards_command_runs_as_printed(job, tmp_path):
    folder, _ = job
    card = (folder / "model_card.md").read_text()
    (command,) = re.findall(r"Use it: `([^`]+)`", card)
    digit = tmp_path / "7.png"
    Image.new("L", (40, 30), 255).save(digit)
    argv = shlex.split(command.replace("images=<file | folder | glob>", f"images={digit}"))
    assert argv[:3] == ["python", "-m", "capsexp.predict"]
    result = predict_cli(*argv[3:], f"hydra.run.dir={tmp_path / 'out'}")
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_run_folder_means_the_checkpoint_lightning_recorded_as_best(tmp_path):
    """Three kept checkpoints; last.ckpt's ModelCheckpoint state names the middle one as best (the state of
    another machine: the folder moved). Without that record, the newest, with a line that says so."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for step in (2, 4, 6):
        torch.save({"state_dict": {}}, run / "checkpoints" / f"epoch_000-step_{step:06d}.ckpt")
    state = {"best_model_path": "/another/machine/run/checkpoints/epoch_000-step_000004.ckpt"}
    torch.save({"callbacks": {"BestAndLastCheckpoint{'monitor': 'val/acc'}": state}}, run / LAST_CHECKPOINT)
    assert best_checkpoint(run) == run / "checkpoints" / "epoch_000-step_000004.ckpt"
    file, note = checkpoint_of(run)
    assert file.name == "epoch_000-step_000004.ckpt" and "as the run recorded it" in note
    (run / LAST_CHECKPOINT).unlink()
    file, note = checkpoint_of(run)
    assert file.name == "epoch_000-step_000006.ckpt" and "no checkpoint of the run records which was best" in note


@pytest.mark.slow
def test_export_neither_prepares_nor_downloads_data_and_names_how_images_become_the_input(job, tmp_path, monkeypatch):
    folder, _ = job
    import capsexp.data.mnist as mnist

    def refused(*args, **kwargs):
        raise AssertionError("export prepared or downloaded data")

    monkeypatch.setattr(mnist.MNISTFiles, "prepare_data", refused)
    monkeypatch.setattr(mnist, "download_and_extract_archive", refused)
    empty = tmp_path / "no_data_here"
    result = export_cli(
        f"ckpt_path={folder}", "check_images=4", f"paths.data_dir={empty}", f"hydra.run.dir={tmp_path}/x"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert not empty.exists()  # no folder made for the data
    check = json.loads((tmp_path / "x" / "check.json").read_text())
    assert check["images"] == "the first 4 test images of mnist"  # the recorded data folder's test files
    sidecar = json.loads((tmp_path / "x" / "model.onnx").with_suffix(".json").read_text())
    assert sidecar["preprocessing"]["resize_filter"].startswith("bilinear, antialiased")
    assert sidecar["preprocessing"]["light_ink"] is True and sidecar["preprocessing"]["digit_box"] == 20
    assert "Replaced initializer" not in result.stdout + result.stderr  # the exporters' own INFO lines


def test_help_shows_the_commands_own_options():
    for module in ("predict", "export"):
        from importlib import import_module

        result = run_cli_in_process("--help", entry=import_module(f"capsexp.{module}").cli)
        assert result.returncode == 0 and f"python -m capsexp.{module} ckpt_path=" in result.stdout
        assert "ckpt_path: ???" in result.stdout and "arm/em_recipe" not in result.stdout
    assert "fit: conventions" in run_cli_in_process("--help", entry=import_module("capsexp.predict").cli).stdout


def test_a_mistake_is_named_before_torch_loads():
    """predict's checks run before torch and Lightning are imported: an error comes in a second or two."""
    code = (
        "import sys\n"
        "sys.argv = ['capsexp.predict', 'ckpt_path=missing/run', 'images=.']\n"
        "from capsexp.predict import cli\n"
        "try:\n    cli()\nexcept SystemExit:\n    pass\n"
        "print('torch loaded' if 'torch' in sys.modules else 'torch not loaded')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT_ROOT)
    assert "ckpt_path=missing/run: no such file" in result.stderr and result.stdout.strip() == "torch not loaded"
