"""A mistyped key is answered before torch and Lightning are imported (they take seconds): the key,
the nearest one there is, and what its node has. Seen from inside the process: Python's import trace
(``-X importtime``) lists every module imported before the answer."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import PROJECT_ROOT


def answer_and_imports(*arguments: str) -> tuple[subprocess.CompletedProcess, list[str], set[str]]:
    """``python -m capsexp <arguments>`` with the import trace: the run, its message's lines, the
    top-level packages it imported."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "capsexp", *arguments],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    trace = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
    message = [line for line in result.stderr.splitlines() if line.strip() and line not in trace]
    packages = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in trace[1:]}  # [0]: the header
    return result, message, packages


@pytest.mark.parametrize(
    ("arguments", "first_line", "second_line"),
    [
        (
            ["trainer.max_step=5"],
            "trainer.max_step=5: no such key (did you mean trainer.max_steps?)",
            "  trainer has: ",
        ),
        (
            ["model=capsnet", "data.bach_size=8"],
            "data.bach_size=8: no such key (did you mean data.batch_size?)",
            "  data has: ",
        ),
        (["modle=lenet5"], "modle=lenet5: no such key (did you mean model=lenet5?)", "  the config has: "),
        (
            ["model=em_caps_small", "model.net.conv_caps1_type=3"],
            "model.net.conv_caps1_type=3: no such key (did you mean model.net.conv_caps1_types?)",
            "  model.net has: _target_, in_channels, num_classes, conv_channels, primary_types, conv_caps1_types, ",
        ),
        (
            ["model=capsnet", "model.net.primry_types=4"],
            "model.net.primry_types=4: no such key (did you mean model.net.primary_types?)",
            "  model.net has: _target_, in_channels, image_size, num_classes, reconstruction, objects, backbone, ",
        ),
    ],
)
def test_a_mistyped_key_is_answered_before_torch_is_imported(arguments, first_line, second_line):
    result, message, packages = answer_and_imports(*arguments)
    assert result.returncode == 2, result.stderr[-2000:]
    assert message[0] == f"error: {first_line}" and message[1].startswith(second_line), message
    assert len(message) == 2 and "Traceback" not in result.stderr
    assert "hydra" in packages and not packages & {"torch", "lightning", "torchmetrics"}, sorted(packages)


def test_the_keys_read_from_a_nets_source_are_its_signatures():
    """What the typo check reads without torch equals what the run's config is built from."""
    from capsexp.config.hydra_setup import NETS, keyword_names, signature_node

    for target in NETS:
        assert keyword_names(target) == [k for k in signature_node(target) if k != "_target_"], target
