"""ckpt_path=<run folder>: the run's own overrides, then the new ones, its last.ckpt and its folder."""

from __future__ import annotations

from capsexp.resume import expand_run_folder


def test_a_run_folder_expands_to_its_overrides_then_the_new_ones_its_state_and_its_folder(tmp_path):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- model=em_caps_small\n- trainer.max_epochs=1\n- ckpt_path=old\n")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.ckpt").write_bytes(b"state")
    expanded = expand_run_folder(["--cfg", "job", "trainer.max_epochs=3", f"ckpt_path={run}", "seed=2"])
    assert expanded == [
        "--cfg",
        "job",  # Hydra's flags stay in front
        "model=em_caps_small",
        "trainer.max_epochs=1",  # the run's own, then the new, which win
        "trainer.max_epochs=3",
        "seed=2",
        f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}",
        f"hydra.run.dir={run}",
    ]


def test_anything_but_a_folder_is_left_to_the_checkpoint_checks(tmp_path):
    arguments = ["model=lenet5", f"ckpt_path={tmp_path / 'x.ckpt'}"]
    assert expand_run_folder(arguments) == arguments
    assert expand_run_folder(["model=lenet5"]) == ["model=lenet5"]
