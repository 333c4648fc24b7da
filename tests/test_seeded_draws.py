"""Every component that draws at random, for the three properties a user relies on: the same seed gives
the same draws, another seed other draws, and two successive draws within a run differ (a component
re-seeded inside would repeat itself)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch

from capsexp.attacks import AdversarialEvaluation, PixelClassifier
from capsexp.data.base import evaluation_generator
from capsexp.data.resumable import EpochSampler, step_generator
from capsexp.nn import RandomRouting, RoutingCapsules


def random_couplings(seed: int, call: int) -> torch.Tensor:
    """RandomRouting's couplings at the ``call``-th pass of a layer built after ``seed=``."""
    torch.manual_seed(seed)
    layer = RoutingCapsules(6, 4, 3, 5, routing=RandomRouting())
    children = torch.ones(2, 6, 4)
    couplings = [
        layer.router(layer.votes(children), children, children.new_ones(2, 6)).assignment for _ in range(call + 1)
    ]
    return couplings[call]


def with_run_seed(seed: int) -> None:
    os.environ["PL_GLOBAL_SEED"] = str(seed)  # as Lightning's seed_everything publishes the run's seed


def augmentation(seed: int, call: int) -> torch.Tensor:
    """The draws of training step ``call``'s augmentation."""
    with_run_seed(seed)
    return torch.rand(8, generator=step_generator(torch.device("cpu"), call))


def training_order(seed: int, call: int) -> torch.Tensor:
    """Epoch ``call``'s order of a 20-sample training set."""
    with_run_seed(seed)
    sampler = EpochSampler(range(20))
    sampler.set_epoch(call)
    return torch.tensor(list(sampler))


def evaluation_set(seed: int, call: int) -> torch.Tensor:
    """The draws of a fixed evaluation set drawn at random (canvas placements, pairs): split ``call``."""
    return torch.rand(8, generator=evaluation_generator(seed, call))


def pgd_start(seed: int, call: int) -> torch.Tensor:
    """PGD's adversarial examples of the ``call``-th of two identical batches in one attack: each starts
    from its own random point."""
    generator = torch.Generator().manual_seed(0)  # the model and images: not from torch's own generator
    linear = torch.nn.utils.skip_init(torch.nn.Linear, 16, 3)  # no draw from torch's generator
    with torch.no_grad():
        linear.weight.copy_(torch.randn(3, 16, generator=generator))
        linear.bias.copy_(torch.randn(3, generator=generator))
    model = PixelClassifier(torch.nn.Sequential(torch.nn.Flatten(), linear), lambda x: x)
    pixels, labels = torch.rand(4, 1, 4, 4, generator=generator), torch.tensor([0, 1, 2, 0])
    evaluation = AdversarialEvaluation(method="pgd", eps=[0.3], steps=1, seed=seed, examples=8)
    examples = evaluation.run(model, None, [(pixels, labels), (pixels, labels)], num_classes=3).examples
    return examples[:, 4 * call : 4 * (call + 1)]


DRAWS: dict[str, Callable[[int, int], torch.Tensor]] = {
    "random routing": random_couplings,
    "training augmentation": augmentation,
    "training order": training_order,
    "evaluation sets": evaluation_set,
    "attack (PGD's random start)": pgd_start,
}


@pytest.mark.parametrize("name", list(DRAWS))
def test_a_seed_repeats_the_draws_another_changes_them_and_successive_draws_differ(name, monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # restored after the test
    draw = DRAWS[name]
    first = draw(1, 0)
    assert torch.equal(draw(1, 0), first), "the same seed drew otherwise"
    assert not torch.equal(draw(2, 0), first), "another seed drew the same"
    assert not torch.equal(draw(1, 1), first), "two successive draws are the same"


def test_an_attack_leaves_the_runs_own_random_generator_where_it_was():
    """PGD seeds torch's generator for foolbox's random start; the run's draws after it are those it
    would have drawn without the attack."""
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    pgd_start(5, 0)
    assert torch.equal(torch.rand(3), expected)
