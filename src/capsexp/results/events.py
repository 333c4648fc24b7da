"""A run's TensorBoard event files, read back: the one reader for ``capsexp.compare``, the
experiments and the tests."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


class Scalar(NamedTuple):
    step: int
    value: float


def load_events(run_dir: str | Path, **size_guidance: int) -> EventAccumulator:
    """The event files of ``run_dir/tensorboard`` (or of ``run_dir`` itself when it holds them), loaded.

    ``size_guidance``: how many events of a kind to keep, 0 for all (``images=0``, ``histograms=0``);
    every scalar is kept.
    """
    # Imported here: tensorboard's reader takes a second to import, and most runs never read back.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder = Path(run_dir)
    if (folder / "tensorboard").is_dir():
        folder = folder / "tensorboard"
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, **size_guidance})
    events.Reload()
    return events


def read_scalars(run_dir: str | Path) -> dict[str, list[Scalar]]:
    """Every scalar series of a run: tag -> [(step, value), ...] in the order logged."""
    events = load_events(run_dir)
    return {tag: [Scalar(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def last_scalar(run_dir: str | Path, tag: str) -> float:
    """The last value of ``tag`` in a run; ``KeyError`` naming the run and the tags it has otherwise."""
    scalars = read_scalars(run_dir)
    if not scalars.get(tag):
        raise KeyError(f"{tag} was not logged in {run_dir} (it has: {', '.join(sorted(scalars)) or 'no scalars'})")
    return scalars[tag][-1].value
