"""The routing contract (capsexp.testing), max-min normalisation itself, and the results page."""

from pathlib import Path

import pytest
import torch
from max_min_routing import MaxMinRouting
from max_min_routing.routing import max_min_normalise

from capsexp.config.config_check import config_problems
from capsexp.testing import RoutingContract, assert_page_rebuilds, assert_trains


class TestMaxMinRouting(RoutingContract):
    routing = MaxMinRouting()
    # Each coupling in [lower, upper], independently: a child's couplings do not sum to one (the method's point).
    assignment_sums_to_one = False


class TestMaxMinRoutingWithOtherBounds(TestMaxMinRouting):
    routing = MaxMinRouting(iterations=2, lower=0.1, upper=0.9)


def test_each_childs_logits_are_mapped_onto_the_bounds():
    logits = torch.tensor([[2.0, -1.0, 0.5], [3.0, 3.0, 3.0]])
    normalised = max_min_normalise(logits, lower=0.2, upper=0.8)
    # By hand: (b - min) / (max - min) = 1, 0, 0.5, then 0.2 + 0.6 x; equal logits give the upper bound.
    torch.testing.assert_close(normalised, torch.tensor([[0.8, 0.2, 0.5], [0.8, 0.8, 0.8]]))


def test_the_results_page_rebuilds_byte_identical_from_its_runs(tmp_path):
    """results/ as a reader would check it: its page, table and figures written again from the runs kept
    beside them (the study's hypotheses and claims read from this package's conf/experiment/)."""
    assert_page_rebuilds(Path(__file__).resolve().parents[1] / "results", tmp_path)


@pytest.mark.parametrize("model", ["capsnet_small", "em_caps_small"])
def test_it_trains_in_capsnet_and_in_the_matrix_capsules_from_the_command_line(model, tmp_path):
    """model=<model> model/routing=max_min, as a user runs it: in em_caps_small it routes each ConvCaps
    window and the class capsules in EM's place."""
    assert_trains(model, "max_min", tmp_path)


def test_capsexps_documented_commands_naming_max_min_compose_and_pass_the_check():
    """Each ``python -m capsexp ... max_min ...`` command of capsexp's README and docs/, its sweep's first job,
    composes with this package installed and passes the check (capsexp's docs test skips them without it)."""
    from tests.helpers import compose_config
    from tests.test_docs import documented_commands, first_job

    commands = [command for _, command in documented_commands() if "max_min" in command]
    assert commands
    for command in commands:
        assert config_problems(compose_config(first_job(command.split()))) == [], command
