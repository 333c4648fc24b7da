"""experiments/mutation.py's judgements: which survivors it counts as explained, and its samples."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def mutation():
    import mutation  # experiments/mutation.py (pytest's pythonpath)

    return mutation


@pytest.mark.parametrize(
    ("original", "mutant"),
    [
        ("rows = torch.arange(height, device=device) + 0.5", "rows = torch.arange(height, device=None) + 0.5"),
        ("rows = torch.arange(height, device=device) + 0.5", "rows = torch.arange(height, ) + 0.5"),
        ("x = y.to(images.device)", "x = y.to(None)"),
        ("target = Wrap(module.to(device), t)", "target = Wrap(module.to(None), t)"),
        (
            "d = torch.rand(n, device=g.device if g else None)",
            "d = torch.rand(n, device=g.device if (g) and False else None)",
        ),
        ("with open(path, device=d) as f:", "with open(path, ) as f:"),  # a header line parses too
        ("parts = self.pools_on(specs.device)", "parts = self.pools_on(None)"),  # a device passed by position
        ("if str(device) not in cache:", "if str(None) not in cache:"),
        (").to(images.device)", ").to(None)"),  # the end of a call over several lines
        ("device = labels.device", "device = None"),
    ],
)
def test_a_mutant_that_only_puts_a_tensor_on_the_cpu_is_device_only(mutation, original, mutant):
    assert mutation.device_only([original], [mutant])


@pytest.mark.parametrize(
    ("original", "mutant"),
    [
        # crashes without a generator: not the same result on the CPU
        (
            "d = torch.rand(n, device=g.device if g else None)",
            "d = torch.rand(n, device=g.device if (g) or True else None)",
        ),
        ("x = y.to(images.dtype)", "x = y.to(None)"),  # a dtype, not a device
        ("f(batches(data, device), n)", "f(batches(data, device), None)"),  # another argument changed
        ("x = torch.zeros(3, device=device) + 1", "x = torch.zeros(3, device=None) + 2"),  # and a constant
        ("urlopen(url, timeout=60)", "urlopen(url, timeout=None)"),
        ("x = torch.clamp(y, 0, 255)", "x = torch.clamp(y, None, 255)"),
        ("name = getattr(module, 'net', module)", "name = getattr(module, 'net', None)"),
        ("pairs = zip(a, b, strict=True)", "pairs = zip(a, b, strict=None)"),
        ("steps = self.steps", "steps = None"),
    ],
)
def test_a_mutant_that_changes_more_than_the_device_is_not(mutation, original, mutant):
    assert not mutation.device_only([original], [mutant])


def test_wording_is_prose_wrapped_in_xx_and_nothing_else(mutation):
    assert mutation.wording_only(['log.info("wrote the page")'], ['log.info("XXwrote the pageXX")'])
    assert not mutation.wording_only(['mode="bilinear"'], ['mode="XXbilinearXX"'])  # an option's spelling
    assert not mutation.wording_only(['log.info("wrote the page")'], ['log.info("WROTE THE PAGE")'])


def test_the_sample_is_seeded_and_takes_n_of_each_area(mutation):
    names = [f"capsexp.models.capsnet.x_f__mutmut_{i}" for i in range(100)]
    names += [f"capsexp.data.mnist.x_g__mutmut_{i}" for i in range(30)]
    names += [f"capsexp.data.resumable.x_h__mutmut_{i}" for i in range(5)]
    picked = mutation.sample(names, 20)
    assert picked == mutation.sample(list(reversed(names)), 20)  # the order it is given does not matter
    by_area = {area: sum(mutation.area_of(name) == area for name in picked) for area in mutation.AREAS}
    assert by_area["capsexp.models"] == by_area["capsexp.data"] == 20 and by_area["capsexp.data.resumable"] == 5


def test_a_sampled_score_gives_its_interval(mutation):
    assert mutation.score(45, 50, sampled=False) == "90.0%"
    assert mutation.score(45, 50, sampled=True) == "90% (79-96%)"  # Wilson, 95%
    assert mutation.score(0, 0, sampled=True) == "not run"
