"""The one override reader: key and value of ``key=value`` with every prefix Hydra's grammar allows."""

from __future__ import annotations

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from capsexp.overrides import (
    hydra_value,
    is_override,
    is_sweep,
    key,
    left_side,
    of_key,
    prefix,
    value,
    values_of,
    with_value,
    without,
    written,
)
from capsexp.run.resume import expand_run_folder
from tests.helpers import saved_run

# (argument, prefix, key, value as written): every form Hydra's grammar takes.
FORMS = [
    ("seed=3", "", "seed", "3"),
    ("+seed=3", "+", "seed", "3"),
    ("++seed=3", "++", "seed", "3"),
    ("~seed=3", "~", "seed", "3"),
    ("~callbacks.progress_bar", "~", "callbacks.progress_bar", None),
    ("+arm/routing=sinkhorn,uniform", "+", "arm/routing", "sinkhorn,uniform"),
    ("ckpt_path='runs/model=capsnet,seed=1'", "", "ckpt_path", "'runs/model=capsnet,seed=1'"),
    ("model.net.in_channels=${oc.env:C}", "", "model.net.in_channels", "${oc.env:C}"),
]


@pytest.mark.parametrize(("argument", "expected_prefix", "expected_key", "expected_written"), FORMS)
def test_every_prefix_hydra_allows_is_read_as_hydra_reads_it(argument, expected_prefix, expected_key, expected_written):
    assert is_override(argument)
    assert (prefix(argument), key(argument), written(argument)) == (expected_prefix, expected_key, expected_written)
    hydras = OverridesParser.create().parse_override(argument)
    assert key(argument) == hydras.key_or_group + (f"@{hydras.package}" if hydras.package else "")
    assert left_side(argument) == expected_prefix + expected_key


def test_flags_and_their_values_are_no_overrides():
    for argument in ("-m", "--multirun", "--cfg", "job", "-cn", "--info"):
        assert not is_override(argument)


def test_a_value_is_what_hydra_reads_and_a_sweep_is_left_as_written():
    assert value("ckpt_path='runs/model=capsnet,seed=1'") == "runs/model=capsnet,seed=1"
    assert value("images='my photos/a b'") == "my photos/a b"
    assert value("seed=1,2,3") == "1,2,3" and is_sweep("seed=1,2,3") and is_sweep("+seed=range(3)")
    assert not is_sweep("data.shifts=[1,2]") and not is_sweep("ckpt_path='a,b'")
    assert value("ckpt_path=null") == "null"  # not a string to Hydra: as written


def test_the_overrides_of_a_key_are_found_whatever_their_prefix():
    arguments = ["-m", "seed=1", "model=lenet5", "++seed=2", "+seed=4", "~seed", "trainer.seed_x=9"]
    assert of_key(arguments, "seed") == ["seed=1", "++seed=2", "+seed=4", "~seed"]
    assert values_of(arguments, "seed") == ["1", "2", "4"]  # the last given is the one Hydra uses
    assert without(arguments, "seed", "model") == ["-m", "trainer.seed_x=9"]
    assert with_value("++ckpt_path=a", hydra_value("b=c")) == "++ckpt_path='b=c'"


def test_a_run_folder_given_with_any_prefix_is_expanded(tmp_path):
    run = saved_run(tmp_path / "run", "- model=lenet5\n- ++seed=7\n")
    for given in (f"ckpt_path={run}", f"+ckpt_path={run}", f"++ckpt_path={run}"):
        expanded = expand_run_folder(["++seed=8", given])
        # The run's own ++seed=7 gives way to the ++seed=8 given now, whatever their prefixes.
        assert expanded == ["model=lenet5", "++seed=8", f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}",
                            f"hydra.run.dir={run}"]  # fmt: skip
