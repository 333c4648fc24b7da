"""A run's TensorBoard event files, read back: the one reader for ``capsexp.compare``, the
experiments and the tests."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


class Scalar(NamedTuple):
    step: int
    value: float


LEGACY_EVENT_FOLDER = "tensorboard"  # where runs kept their event files before they moved into the run's folder


def event_folder(run_dir: str | Path) -> Path:
    """The folder of a run's event files: the run's own, or its ``tensorboard/`` in runs written
    before event files moved up (results pages keep such runs)."""
    folder = Path(run_dir)
    return folder / LEGACY_EVENT_FOLDER if (folder / LEGACY_EVENT_FOLDER).is_dir() else folder


def event_files(run_dir: str | Path) -> list[Path]:
    """A run's event files, oldest first."""
    return sorted(event_folder(run_dir).glob("events.out.tfevents.*"))


def writer_of(event_file: Path) -> tuple[str, int]:
    """The process that wrote an event file and when it opened it: ``(<host>.<pid>, <time>)`` from the name
    TensorBoard's writer gives it, ``events.out.tfevents.<time>.<host>.<pid>.<n>[<suffix>]`` (a host
    name may hold dots; the pid and the writer's count are the last two numbers)."""
    fields = event_file.name.split(".")
    numbers = [i for i in range(4, len(fields)) if fields[i].isdigit()]
    pid = numbers[-2] if len(numbers) >= 2 else len(fields) - 1
    return ".".join(fields[4 : pid + 1]), int(fields[3]) if fields[3].isdigit() else 0


def _fast_checksums() -> None:
    """TensorBoard without TensorFlow checks each record's CRC-32C in pure Python: 80% of the time a
    results page took to read its 45 runs (6.5 of 8 s, profiled). ``google_crc32c`` computes the same
    checksum in C; its value replaces the pure-Python one where the reader looks it up."""
    import google_crc32c
    from tensorboard.compat.tensorflow_stub import pywrap_tensorflow

    pywrap_tensorflow.crc32c = google_crc32c.value


def load_events(run_dir: str | Path, **size_guidance: int) -> EventAccumulator:
    """The event files of a run (:func:`event_folder`), loaded.

    ``size_guidance``: how many events of a kind to keep, 0 for all (``images=0``, ``histograms=0``);
    every scalar is kept.
    """
    # Imported here: tensorboard's reader takes a second to import, and most runs never read back.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _fast_checksums()

    events = EventAccumulator(str(event_folder(run_dir)), size_guidance={"scalars": 0, **size_guidance})
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


def copy_events(source: Path, target: Path, images: Collection[str] = ()) -> None:
    """The event file ``source`` written again to ``target``, every record as it is but the images: only
    those tagged as in ``images`` are kept. Images are most of a run's event bytes (a 1,719-step run's
    couplings, reconstructions and pose perturbations: 0.4 of its 0.47 MB), and a results page reads none but
    the ones it draws."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    with open(target, "wb") as out:
        writer = RecordWriter(out)
        for record in RawEventFileLoader(str(source)).Load():
            event = event_pb2.Event.FromString(record)
            values = event.summary.value
            kept = [value for value in values if not value.HasField("image") or value.tag in images]
            if len(kept) < len(values):
                if not kept:
                    continue
                del values[:]
                values.extend(kept)
                record = event.SerializeToString()
            writer.write(record)
