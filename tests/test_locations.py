"""What a location is, one answer for the command line, run names, the HParams tab and results pages; and a
location typed as capsexp printed it reaches Hydra as that path."""

from __future__ import annotations

import ast
import subprocess
import sys
from types import SimpleNamespace

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from capsexp.config.run_names import job_name, run_name
from capsexp.locations import is_location, is_setting, quote_locations
from capsexp.results.runs import Run
from tests.helpers import PROJECT_ROOT

LOCATIONS = [
    "ckpt_path",
    "+ckpt_path",
    "images",
    "data.data_dir",
    "data.root",
    "image_folder_root",
    "paths.log_dir",
    "hydra.run.dir",
    "trainer.default_root_dir",
    "callbacks.model_checkpoint.dirpath",
    "attack.source",
    "++attack.source",
]
SETTINGS = ["model", "arm/source", "+arm/routing", "seed", "trainer.max_steps", "model.net.routing.iterations", "data"]


@pytest.mark.parametrize("key", LOCATIONS)
def test_keys_that_name_files_are_locations(key):
    assert is_location(key) and not is_setting(f"{key}=x")


@pytest.mark.parametrize("key", SETTINGS)
def test_keys_that_say_what_ran_are_settings(key):
    assert not is_location(key) and is_setting(f"{key}=x")


def test_task_name_and_tags_are_neither_a_location_nor_a_setting():
    assert not is_location("task_name") and not is_setting("task_name=mine") and not is_setting("tags=[a]")


def read_back(argument: str) -> str:
    """What Hydra's own parser reads as the value of ``argument`` (the check is Hydra's, not ours)."""
    return OverridesParser.create().parse_override(argument).value()


@pytest.mark.parametrize(
    "folder",
    [
        "logs/train/multiruns/2026-11-29_01-00-00/model=capsnet_small,seed=1",
        "logs/train/runs/2026-11-29_01-06-03-449399_model=capsnet_small,trainer.max_steps=1200",
        "/abs/path with space/run[1]",
        "logs/it's here",
        "~/photos",  # as a shell leaves it unexpanded (quoted, or zsh): Hydra refuses ~ unquoted
        "~user/my photos/.cache",
    ],
)
def test_a_folder_typed_as_printed_reaches_hydra_as_that_path(folder, tmp_path):
    for key in ("ckpt_path", "images", "hydra.run.dir"):
        (quoted,) = quote_locations([f"{key}={folder}"])
        assert read_back(quoted) == folder, quoted
    # The same folder on this machine (a sweep-looking value that exists is one path, not a sweep).
    existing = tmp_path / "model=lenet5,seed=2"
    existing.mkdir()
    (quoted,) = quote_locations([f"ckpt_path={existing}"])
    assert read_back(quoted) == str(existing)


def test_what_hydra_already_reads_is_left_as_written():
    given = [
        "ckpt_path='logs/x/model=a,seed=1'",
        "ckpt_path=null",
        "paths.data_dir=${oc.env:HOME}",
        "ckpt_path=logs/plain/run/checkpoints/last.ckpt",
        "model=capsnet,lenet5",  # a sweep of a setting: not a location
        "-m",
        "seed=1,2",
    ]
    assert quote_locations(given) == given


def test_run_folders_and_results_labels_leave_every_location_out():
    overrides = ["model=capsnet", "data.data_dir=/data/mnist", "paths.log_dir=/x", "ckpt_path=/a.ckpt", "seed=3"]
    assert run_name("2026", overrides) == "2026_model=capsnet,seed=3"
    run = Run(folder=PROJECT_ROOT, overrides=[*overrides, "task_name=mine", "data.root=/photos"])
    assert run.setting == ("model=capsnet",)
    assert job_name(["data.data_dir=/data", "model=capsnet"], "/no/sweep", 4) == "4"


def test_the_root_package_imports_no_room_and_no_module_imports_the_root():
    """``import capsexp`` loads neither torch nor a room of the package, and no module of the package
    imports the root (the folders' constants live in capsexp.locations), so that the root's facade
    (``capsexp.load``) is no hidden upward import."""
    code = "import sys, capsexp; print(sorted(m for m in sys.modules if m.startswith(('capsexp.', 'torch'))))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"
    root = PROJECT_ROOT / "src" / "capsexp"
    for path in root.rglob("*.py"):
        if path == root / "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.module != "capsexp", f"{path.relative_to(root)} imports the root package"
    init = (root / "__init__.py").read_text()
    assert "importlib" not in init
    import capsexp

    assert capsexp.load.__module__ == "capsexp.use.inference" and capsexp.CONFIG_DIR == PROJECT_ROOT / "conf"


def test_a_step_after_a_sweep_passes_on_what_a_run_ran_and_where_its_data_is():
    from capsexp.locations import is_relaunched

    kept = ["model=capsnet", "data.data_dir=/d", "paths.data_dir=/e", "image_folder_root=/f", "data.root=/g"]
    dropped = ["ckpt_path=/a.ckpt", "++attack.source=/b.ckpt", "hydra.run.dir=/r", "paths.log_dir=/l", "task_name=t"]
    assert [o for o in kept + dropped if is_relaunched(o)] == kept


def test_a_routing_packages_studies_are_found_on_hydras_search_path_and_named_by_their_package(tmp_path, monkeypatch):
    """A package that registers a routing (here importable from a dot-folder, as ``pip install --target`` may
    put it) has its conf/ read from Hydra's own search path: its study is found and named ``<package>/conf/...``."""
    from capsexp import locations
    from capsexp.config import routing_registry

    package = tmp_path / ".packages" / "mean_agreement"
    (package / "conf" / "experiment").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "conf" / "experiment" / "mean_agreement_study.yaml").write_text("# @package _global_\n")
    monkeypatch.syspath_prepend(str(tmp_path / ".packages"))
    point = SimpleNamespace(module="mean_agreement.route", dist=SimpleNamespace(name="mean-agreement"))
    monkeypatch.setattr(routing_registry, "registered", dict)
    monkeypatch.setattr(routing_registry, "entry_points", lambda group: [point])
    conf = (package / "conf").resolve()
    folders = locations.config_folders()
    assert folders == [locations.CONFIG_DIR, conf], folders
    found = locations.experiment_file("mean_agreement_study")
    assert found == conf / "experiment" / "mean_agreement_study.yaml"
    assert locations.shown(found) == "mean_agreement/conf/experiment/mean_agreement_study.yaml"
    assert locations.experiment_files()["mean_agreement_study"] == found
