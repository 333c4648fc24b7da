"""Where output is not a terminal (a file, a pipe: SLURM, nohup, CI, ``| tee``), progress is log lines
and no Rich bar; on a terminal, the bar. ``callbacks.progress_log.when=always|never`` as
docs/running.md says."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from capsexp.callbacks import progress_log
from tests.helpers import PROJECT_ROOT, TINY_RUN, run_cli_in_process

# A bar's line, as Rich draws it: "Epoch 0/0  ━━━━━━━━ 2/2 0:00:01 • 0:00:00 4.40it/s" (tables of
# results use the same heavy line, but have no rate).
BAR = re.compile(r"[━╸╺].* \d+/\d+ .*it/s")
ANSI = "\x1b["
LINES = ("training: 2 steps, a line every 0.001 s", "step 1/2 (50.0%)", "step 2/2 (100.0%)", "training done: 2 steps")


def tiny_run(mnist_dir, folder, *overrides: str) -> list[str]:
    return [
        *(o for o in TINY_RUN if o != "callbacks.progress_bar=null"),
        f"paths.data_dir={mnist_dir}",
        "trainer.max_steps=2",
        "trainer.limit_train_batches=2",  # an epoch of 2 steps, then a validation
        "trainer.limit_val_batches=1",
        "test=false",
        "callbacks.progress_log.interval_s=0.001",  # a line at every step
        f"hydra.run.dir={folder}",
        *overrides,
    ]


@pytest.mark.slow  # a process of its own: about 10 s, most of it importing torch and Lightning
def test_into_a_pipe_progress_is_log_lines_and_no_bar(mnist_dir, tmp_path):
    """A real process writing into a pipe, as ``| tee`` or a batch system's log file has it."""
    result = subprocess.run(
        [sys.executable, "-m", "capsexp", *tiny_run(mnist_dir, tmp_path / "run")],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    printed = result.stdout + result.stderr
    assert result.returncode == 0, result.stderr[-3000:]
    assert not BAR.search(printed) and ANSI not in printed, printed[-3000:]
    assert all(line in printed for line in LINES), printed[-3000:]


@pytest.mark.parametrize(
    ("terminal", "when", "bar", "lines"),
    [
        (False, "auto", False, True),
        (False, "always", False, True),
        (False, "never", False, False),
        (True, "auto", True, False),
        (True, "always", True, True),
        (True, "never", True, False),
    ],
)
def test_the_bar_on_a_terminal_and_the_lines_as_progress_log_when_says(
    mnist_dir, tmp_path, monkeypatch, terminal, when, bar, lines
):
    """In this process (its output captured: not a terminal), and as if it were a terminal."""
    monkeypatch.setattr(progress_log, "on_a_terminal", lambda: terminal)
    result = run_cli_in_process(*tiny_run(mnist_dir, tmp_path / "run", f"callbacks.progress_log.when={when}"))
    printed = result.stdout + result.stderr
    assert result.returncode == 0, result.stderr[-3000:]
    assert bool(BAR.search(printed)) is bar, printed[-3000:]
    assert all(line in printed for line in LINES) is lines and any(line in printed for line in LINES) is lines
