"""capsexp as a package, not only a checkout: the wheel carries the configs and its metadata, an installed
capsexp writes its runs and reads its data in the folder it is run from, and (slow, `make test-package`)
a wheel and `pip install .` in a fresh virtual environment train, predict with the run folder they print,
and take the example routing package, from an empty folder and writing nothing into the checkout."""

from __future__ import annotations

import email
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from capsexp.locations import CHECKOUT, log_dir, working_root
from tests.helpers import PROJECT_ROOT, compose_config, real_data_dir, write_mnist

EXAMPLE = PROJECT_ROOT / "examples" / "max_min_routing"


def build_wheel(into: Path) -> Path:
    """``pip wheel --no-deps .`` as the README says, without build isolation (setuptools is in the venv)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(into), "."],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = into.glob("capsexp-*.whl")
    return wheel


def test_the_wheel_carries_every_config_the_plugins_and_complete_metadata(tmp_path):
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(archive.read(metadata_name))
    configs = {
        f"capsexp/conf/{p.relative_to(PROJECT_ROOT / 'conf').as_posix()}"
        for p in (PROJECT_ROOT / "conf").rglob("*.yaml")
    }
    assert "capsexp/conf/config.yaml" in configs and configs <= names, sorted(configs - names)[:5]
    assert {"hydra_plugins/capsexp_searchpath/__init__.py", "hydra_plugins/capsexp_sweepers/__init__.py"} <= names
    assert not [n for n in names if n.startswith(("tests/", "experiments/", "examples/", "docs/"))]
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert metadata["License-Expression"] == "MIT"
    classifiers = metadata.get_all("Classifier")
    assert "Intended Audience :: Science/Research" in classifiers
    assert "Programming Language :: Python :: 3.11" in classifiers
    # The version has one home, capsexp.__version__, read by setuptools without importing the package.
    version = re.search(r'^__version__ = "(.+)"$', (PROJECT_ROOT / "src/capsexp/__init__.py").read_text(), re.M)
    assert metadata["Version"] == version.group(1) and wheel.name.startswith(f"capsexp-{version.group(1)}-")
    assert "torch==2.14.1" in metadata.get_all("Requires-Dist")


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_capsexp_version_names_capsexp_not_hydra(flag):
    from importlib.metadata import version

    done = subprocess.run([sys.executable, "-m", "capsexp", flag], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == f"capsexp {version('capsexp')}\n", done.stderr


def test_a_folder_of_ones_own_gets_its_own_logs_and_data_and_the_checkout_keeps_its_own(tmp_path, monkeypatch):
    """A researcher's folder (a routing package, a paper's repository) gets ``logs/`` and ``data/`` of its
    own; a command from inside the checkout (``experiments/``, ``make train``) writes where it always has."""
    mine = tmp_path / "my paper" / "code"
    mine.mkdir(parents=True)
    monkeypatch.delenv("CAPSEXP_LOG_DIR", raising=False)
    monkeypatch.delenv("CAPSEXP_DATA_DIR", raising=False)
    monkeypatch.chdir(mine)
    assert working_root() == mine and log_dir() == mine / "logs"
    cfg = compose_config(["model=lenet5"])
    assert Path(cfg.paths.log_dir) == mine / "logs" and Path(cfg.paths.data_dir) == mine / "data"
    monkeypatch.setenv("CAPSEXP_LOG_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("CAPSEXP_DATA_DIR", "../datasets")
    cfg = compose_config(["model=lenet5"])
    assert cfg.paths.log_dir == str(tmp_path / "elsewhere") and cfg.paths.data_dir == "../datasets"
    assert log_dir() == tmp_path / "elsewhere"
    monkeypatch.delenv("CAPSEXP_LOG_DIR")
    monkeypatch.chdir(PROJECT_ROOT / "experiments")
    assert CHECKOUT == PROJECT_ROOT and working_root() == PROJECT_ROOT and log_dir() == PROJECT_ROOT / "logs"
    assert Path(compose_config(["model=lenet5"]).paths.log_dir) == PROJECT_ROOT / "logs"


def _checkout_files() -> set[str]:
    """The checkout's files, but for what Python, pytest and the builds write for themselves."""
    skipped = {".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", "mutants", "build"}
    found = set()
    for folder, folders, files in os.walk(PROJECT_ROOT):
        folders[:] = [f for f in folders if f not in skipped and not f.endswith(".egg-info")]
        found |= {os.path.join(folder, f) for f in files}
    return found


def _run(command: list[str], cwd: Path, env: dict, timeout: int = 600) -> str:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(command)} in {cwd}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout + done.stderr


def _trains_and_predicts(python: Path, folder: Path, env: dict) -> None:
    """``capsexp model=lenet5 debug=fast`` from an empty folder, then predict with the run folder it printed."""
    folder.mkdir()
    capsexp = python.parent / "capsexp"
    printed = _run([str(capsexp), "model=lenet5", "debug=fast"], folder, env)
    run = re.findall(r"Run folder: (\S+)", printed)[-1]
    assert (folder / run / "model_card.md").is_file() and run.startswith("logs/"), run
    images = folder / "my digits"
    images.mkdir()
    _run([str(python), "-c", _DRAW_DIGIT, str(images / "one.png")], folder, env)
    printed = _run([str(python), "-m", "capsexp.predict", f"ckpt_path={run}", "images=my digits/"], folder, env)
    assert re.search(r"^one\.png: \d ", printed, re.M), printed[-2000:]
    assert list((folder / "logs" / "predict" / "runs").glob("*/predictions.csv"))


# A dark stroke on light paper, drawn with Pillow (a dependency of capsexp) in the fresh environment.
_DRAW_DIGIT = (
    "import sys; from PIL import Image, ImageDraw; page = Image.new('L', (80, 90), 235); "
    "ImageDraw.Draw(page).line([(40, 12), (42, 78)], fill=20, width=7); page.save(sys.argv[1])"
)


@pytest.mark.slow
def test_a_wheel_and_pip_install_dot_in_a_fresh_environment_run_from_an_empty_folder(tmp_path):
    """The whole path of an outsider: a wheel built from the repository into a fresh virtual environment
    (torch and the rest from the package index, as a user's pip resolves them), then ``pip install .``
    over it; each trains from an empty folder, predicts with the folder it printed, and the example routing
    package installs against it and trains in a capsule net. Nothing is written into the checkout."""
    before = _checkout_files()  # a run written into the checkout would add its folder's files
    data = tmp_path / "data"
    real = real_data_dir()
    if (real / "MNIST" / "raw").is_dir():
        shutil.copytree(real / "MNIST" / "raw", data / "MNIST" / "raw")
    else:
        write_mnist(data, train=256, test=64)
    environment = tmp_path / "fresh venv"
    subprocess.run([sys.executable, "-m", "venv", str(environment)], check=True, timeout=300)
    python = environment / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON", "CAPSEXP"))}
    env |= {"CAPSEXP_DATA_DIR": str(data), "PATH": f"{environment / 'bin'}{os.pathsep}{env.get('PATH', '')}"}
    try:
        wheel = build_wheel(tmp_path / "dist")
        _run([str(python), "-m", "pip", "install", "-q", str(wheel)], tmp_path, env, timeout=1800)
        listed = _run([str(python), "-m", "pip", "show", "-f", "capsexp"], tmp_path, env)
        assert "Editable project location" not in listed and "capsexp/conf/config.yaml" in listed
        _trains_and_predicts(python, tmp_path / "from the wheel", env)

        # pip install . (not editable) over it, from the checkout, used from another empty folder
        _run(
            [str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(PROJECT_ROOT)],
            tmp_path,
            env,
        )
        _trains_and_predicts(python, tmp_path / "from pip install dot", env)

        # the example routing package, whose dependency on capsexp the installed capsexp satisfies
        _run([str(python), "-m", "pip", "install", "-q", str(EXAMPLE)], tmp_path, env)
        folder = tmp_path / "my routing"
        folder.mkdir()
        for model in ("capsnet_small", "em_caps_small"):  # CapsNet's class capsules; every matrix-capsule layer
            printed = _run(
                [str(environment / "bin" / "capsexp"), f"model={model}", "model/routing=max_min", "debug=fast"],
                folder,
                env,
            )
            assert re.findall(r"Run folder: (logs/\S+)", printed), printed[-2000:]
        composed = _run(
            [str(environment / "bin" / "capsexp"), "experiment=max_min_comparison", "--cfg", "job"], folder, env
        )
        assert "max_min" in composed
    finally:
        shutil.rmtree(environment, ignore_errors=True)  # several GB: not kept among pytest's last runs
    assert not _checkout_files() - before


def test_onnx_export_without_the_export_extra_names_the_install(monkeypatch):
    """A plain install has no ONNX exporter: the error names the extra to install, before the export runs."""
    import importlib.util

    from capsexp.use.export import ExportError, _check_onnx_installed

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else found(name, *a))
    with pytest.raises(ExportError, match=r"format=onnx needs onnxscript, .*pip install 'capsexp\[export\]'"):
        _check_onnx_installed()
