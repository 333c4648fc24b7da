"""MultiMNIST pairs: the invariants of the paper's recipe (section 6.1)."""

from __future__ import annotations

import pytest
import torch

from capsexp.data import MultiMNISTDataModule
from capsexp.data.multi_mnist import overlay_pairs, partners, translate
from tests.helpers import FakeTrainer, synthetic_digits


def digits(count: int = 200, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = synthetic_digits(count, seed)
    return torch.from_numpy(images).float() / 255, torch.from_numpy(labels).long()


def pairs(seed: int, **options):
    images, labels = digits()
    return overlay_pairs(images, labels, torch.Generator().manual_seed(seed), **options)


@pytest.mark.parametrize(("shift", "canvas"), [(4, 36), (6, 40), (0, 28)])
def test_pairs_hold_two_classes_shifted_within_bounds_summed_and_clipped(shift, canvas):
    images, labels = digits()
    made = overlay_pairs(images, labels, torch.Generator().manual_seed(0), shift=shift, canvas=canvas)
    assert made.images.shape == (200, 1, canvas, canvas) and made.components.shape == (200, 2, 1, canvas, canvas)
    assert torch.equal(made.labels[:, 0], labels) and (made.labels[:, 0] != made.labels[:, 1]).all()
    assert made.shifts.abs().max() <= shift
    if shift:
        assert made.shifts.abs().max() == shift and made.shifts.min() < 0  # the whole range is drawn
    assert torch.equal(made.images, made.components.sum(1).clamp(0, 1))
    assert (made.images.sum((1, 2, 3)) < made.components.sum((1, 2, 3, 4))).any()  # overlaps do clip
    # Nothing is pushed off the canvas: each component holds all of its digit's ink.
    first = made.components[:, 0].sum((1, 2, 3))
    assert torch.allclose(first, images.sum((1, 2)), rtol=1e-5)
    # The first component is the digit itself, centred, then shifted by its drawn shift.
    margin = (canvas - 28) // 2
    centred = torch.nn.functional.pad(images, (margin, margin, margin, margin))
    back = translate(made.components[:, 0, 0], -made.shifts[:, 0, 0], -made.shifts[:, 0, 1])
    assert torch.equal(back, centred)


def test_the_same_seed_gives_the_same_pairs_and_another_seed_others():
    a, b, c = pairs(1), pairs(1), pairs(2)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a.labels, c.labels) and not torch.equal(a.shifts, c.shifts)


def test_partners_come_from_the_pool_they_are_drawn_from():
    labels, pool = torch.arange(40) % 10, torch.tensor([3, 7, 7, 3, 5])
    chosen = partners(labels, torch.Generator().manual_seed(0), pool)
    assert chosen.min() >= 0 and chosen.max() < len(pool)
    assert (pool[chosen] != labels).all()
    assert set(pool[chosen].tolist()) == {3, 5, 7}


def test_partners_cover_every_other_class():
    labels = torch.arange(1000) % 10
    chosen = labels[partners(labels, torch.Generator().manual_seed(0))]
    assert (chosen != labels).all()
    for digit in range(10):
        assert set(chosen[labels == digit].tolist()) == set(range(10)) - {digit}


@pytest.mark.parametrize(
    "pool", [[4, 9, 4, 4, 9, 4, 9], [2, 0, 7, 7, 0, 2, 7, 7, 2, 0, 7]], ids=["2 classes", "3 classes"]
)
def test_partners_are_their_draws_in_order(pool):
    """The documented draw, transcribed: for each digit, an offset uniform in 1 .. C-1 turns its class
    (its position among the pool's C classes, ascending) into the partner's class, then a uniform number
    in [0, 1) times that class's count picks the digit among the class's digits in pool order. The order
    of the draws fixes the validation and test pairs of a pair_seed."""
    pool = torch.tensor(pool)
    labels = pool[torch.randint(len(pool), (300,), generator=torch.Generator().manual_seed(1))]
    chosen = partners(labels, torch.Generator().manual_seed(3), pool)
    replay = torch.Generator().manual_seed(3)
    classes = sorted(set(pool.tolist()))
    offsets = torch.randint(1, len(classes), (len(labels),), generator=replay)
    draws = torch.rand(len(labels), generator=replay)
    for label, offset, draw, index in zip(
        labels.tolist(), offsets.tolist(), draws.tolist(), chosen.tolist(), strict=True
    ):
        partner_class = classes[(classes.index(label) + offset) % len(classes)]
        members = [i for i, c in enumerate(pool.tolist()) if c == partner_class]
        assert index == members[int(draw * len(members))]
    assert len(set(chosen.tolist())) == len(pool)  # every digit of the pool is someone's partner


def test_a_uniform_draw_that_rounds_up_to_one_still_picks_a_digit_of_the_drawn_class(monkeypatch):
    """The pick is the draw times the class's count, rounded down: a draw of 1.0 (float rounding of a
    generator's largest value) would point one past the class; it is kept on the class's last digit."""
    pool = torch.tensor([0] * 50 + [1] * 50)
    monkeypatch.setattr(torch, "rand", lambda n, **kwargs: torch.ones(n))
    chosen = partners(torch.tensor([0, 1]), torch.Generator().manual_seed(0), pool)
    assert chosen.tolist() == [99, 49]  # the other class's last digit


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"shift": 5, "canvas": 36}, "shift=5 pushes a 28x28 digit off a 36x36 canvas (at most 4"),
        ({"shift": 5, "canvas": 37}, "shift=5 pushes a 28x28 digit off a 37x37 canvas (at most 4; canvas=38 allows"),
        ({"canvas": 20}, "canvas=20 is smaller than the 28x28 digits"),
        ({"shift": -1}, "overlay_pairs: shift=-1: must be greater than or equal to 0"),
    ],
)
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        pairs(0, **options)


def test_one_class_cannot_be_paired():
    images, _ = digits(10)
    with pytest.raises(ValueError, match="at least two classes"):
        overlay_pairs(images, torch.full((10,), 3), torch.Generator().manual_seed(0))


# ---- the DataModule (data=multi_mnist) ----------------------------------------------------------------
def datamodule(mnist_dir, **options) -> MultiMNISTDataModule:
    """On the synthetic MNIST files: 250 training digits, 50 validation, 100 test."""
    made = MultiMNISTDataModule(
        mnist_dir, batch_size=20, val_size=50, verify_checksums=False, download=False, **options
    )
    made.trainer = FakeTrainer()
    made.prepare_data()
    made.setup()
    return made


def test_evaluation_pairs_are_fixed_and_drawn_within_their_own_split(mnist_dir):
    data = datamodule(mnist_dir, pairs_per_digit=3)
    again, reseeded = datamodule(mnist_dir, pairs_per_digit=3), datamodule(mnist_dir, pairs_per_digit=3, pair_seed=1)
    assert (len(data.data_train), len(data.data_val), len(data.data_test)) == (250, 150, 300)
    for split in ("data_val", "data_test"):
        assert torch.equal(getattr(data, split).specs, getattr(again, split).specs)
        assert not torch.equal(getattr(data, split).specs, getattr(reseeded, split).specs)
    training = set(data.data_train.specs[:, 0].tolist())
    for split, digits in ((data.data_val, set(range(300)) - training), (data.data_test, set(range(300, 400)))):
        first, second = split.specs[:, 0].long(), split.specs[:, 1].long()
        assert set(first.tolist()) | set(second.tolist()) <= digits  # a split's pairs use its digits only
        assert torch.bincount(first)[sorted(digits)].eq(3).all()  # each digit first pairs_per_digit times
        assert torch.equal(split.targets, torch.stack([data.labels[first], data.labels[second]], 1))
        assert (split.targets[:, 0] != split.targets[:, 1]).all()
        assert split.specs[:, 2:].abs().max() == 4


def test_batches_are_composed_from_their_pairs(mnist_dir):
    data = datamodule(mnist_dir, shift=6, canvas=40)
    specs, targets = next(iter(data.test_dataloader()))
    batch = data.on_after_batch_transfer((specs, targets), 0)
    assert batch.images.shape == (20, 1, 40, 40) and batch.components.shape == (20, 2, 1, 40, 40)
    assert torch.equal(batch.targets, targets)
    assert torch.equal(batch.images, batch.components.sum(1).clamp(0, 1))
    for k in range(2):  # each component is its digit, centred and shifted as the spec says
        digit = data.digits[specs[:, k].long()].float() / 255
        centred = torch.nn.functional.pad(digit, (6, 6, 6, 6))
        rows, columns = specs[:, 2 + 2 * k].long(), specs[:, 3 + 2 * k].long()
        assert torch.equal(translate(batch.components[:, k, 0], -rows, -columns), centred)
    # Held on the device (data.on_device), the same pairs come out.
    on_device = datamodule(mnist_dir, shift=6, canvas=40, on_device=True)
    held = next(iter(on_device.test_dataloader()))
    assert all(torch.equal(a, b) for a, b in zip(on_device.on_after_batch_transfer(held, 0), batch, strict=True))


def test_training_pairs_are_new_at_every_step_and_the_same_when_a_step_is_repeated(mnist_dir):
    data = datamodule(mnist_dir)
    data.trainer.training = True
    specs, labels = next(iter(data.train_dataloader()))
    assert specs.shape == (20, 1)  # the first digits only: partners and shifts are drawn per step
    first = data.on_after_batch_transfer((specs, labels), 0)
    repeated = data.on_after_batch_transfer((specs, labels), 0)  # a resumed run redraws the same step
    data.trainer.global_step = 1
    later = data.on_after_batch_transfer((specs, labels), 0)
    assert all(torch.equal(a, b) for a, b in zip(first, repeated, strict=True))
    assert not torch.equal(first.images, later.images) and torch.equal(later.targets[:, 0], labels)
    assert (first.targets[:, 0] != first.targets[:, 1]).all()
    # The partners are training digits: each second component holds the ink of one of them.
    training_ink = (data.digits[data.data_train.specs[:, 0].long()].float() / 255).sum((1, 2))
    second_ink = first.components[:, 1].sum((1, 2, 3))
    assert torch.isclose(second_ink[:, None], training_ink[None], rtol=1e-5).any(1).all()


def test_a_shift_off_the_canvas_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"shift=6 pushes a 28x28 digit off a 36x36 canvas .*canvas=40 allows"):
        MultiMNISTDataModule(shift=6)


def test_under_two_processes_each_trains_on_its_own_share_with_its_own_pairs(mnist_dir):
    made = {}
    for rank in range(2):
        made[rank] = MultiMNISTDataModule(mnist_dir, batch_size=20, val_size=50, verify_checksums=False, download=False)
        made[rank].trainer = FakeTrainer(world_size=2, global_rank=rank, training=True)
        made[rank].prepare_data()
        made[rank].setup()
    shares = [torch.cat([specs for specs, _ in made[rank].train_dataloader()])[:, 0].tolist() for rank in range(2)]
    # The shares of the 250 training digits are disjoint and cover them (125 each).
    assert len(shares[0]) == len(shares[1]) == 125
    assert set(shares[0]).isdisjoint(shares[1]) and len(set(shares[0]) | set(shares[1])) == 250
    # The same first digits at the same step get other partners and shifts on the other process.
    batch = next(iter(made[0].train_dataloader()))
    assert len(batch[0]) == 10  # the global batch of 20 split over the two processes
    first, second = (made[rank].on_after_batch_transfer(batch, 0) for rank in range(2))
    assert torch.equal(first.targets[:, 0], second.targets[:, 0])
    assert not torch.equal(first.components[:, 1], second.components[:, 1])


def test_translate_moves_each_image_down_and_right_by_its_own_shift_with_zeros_shifted_in():
    images = torch.arange(1, 2 * 4 * 5 + 1, dtype=torch.float32).view(2, 4, 5)
    moved = translate(images, torch.tensor([1, -2]), torch.tensor([2, 0]))
    expected = torch.zeros_like(images)
    expected[0, 1:, 2:] = images[0, :3, :3]  # down 1, right 2
    expected[1, :2, :] = images[1, 2:, :]  # up 2
    assert torch.equal(moved, expected)
    # moved off the image entirely, in either direction: nothing is left
    off = translate(images, torch.tensor([5, -5]), torch.tensor([-6, 6]))
    assert torch.equal(off, torch.zeros_like(images))
