"""A sweep's steps after its last job: one that fails is named, its traceback kept, the page still
written over the jobs' results, and the command exits non-zero (Hydra alone would warn and exit 0)."""

from __future__ import annotations

import sys

import pytest
from omegaconf import OmegaConf

from capsexp.results import sweep_page
from capsexp.results.sweep_page import AFTER_SWEEP_LOG, WriteComparison
from tests.test_compare import make_study


def broken_step(folder) -> None:
    raise ValueError(f"no checkpoints under {folder.name}")


def make_broken_step():
    return broken_step


def test_a_failing_after_sweep_step_is_named_and_kept_and_the_page_still_written(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(sweep_page, "FAILED", [])
    make_study(tmp_path / "sweep", {("model=lenet5",): [0.9, 0.92], ("model=capsnet",): [0.95, 0.96]})
    config = OmegaConf.create(
        {
            "hydra": {"sweep": {"dir": str(tmp_path / "sweep")}},
            "after_sweep": [{"_target_": "tests.test_after_sweep.make_broken_step"}],
        }
    )
    WriteComparison().on_multirun_end(config)
    assert sweep_page.FAILED == ["after-sweep step tests.test_after_sweep.make_broken_step"]
    record = (tmp_path / "sweep" / AFTER_SWEEP_LOG).read_text()
    assert "ValueError: no checkpoints under sweep" in record and "Traceback" in record
    line = next(r.getMessage() for r in caplog.records if r.levelname == "ERROR")
    assert line.startswith("after-sweep step tests.test_after_sweep.make_broken_step failed (ValueError: no check")
    assert str(tmp_path / "sweep" / AFTER_SWEEP_LOG) in line
    assert (tmp_path / "sweep" / "README.md").exists()  # the jobs' results stay, their page written


def test_the_command_exits_1_when_a_step_after_the_sweep_failed(monkeypatch, capsys):
    import capsexp.__main__ as entry

    monkeypatch.setattr(sweep_page, "FAILED", [])
    monkeypatch.setattr(entry, "main", lambda: sweep_page.FAILED.append("after-sweep step x.Attack"))
    monkeypatch.setattr(sys, "argv", ["capsexp", "model=lenet5"])
    with pytest.raises(SystemExit) as exit_info:
        entry.cli()
    assert exit_info.value.code == 1
    assert "error: after-sweep step x.Attack failed after the sweep (the jobs' results stay)" in capsys.readouterr().err
