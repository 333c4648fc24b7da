"""Wall-clock timing: the one timer of the experiments and benchmarks."""

from __future__ import annotations

import time


class Stopwatch:
    """``with Stopwatch() as watch: ...``; then ``watch.seconds`` (``time.perf_counter``).

    Read ``watch.elapsed`` inside the block for the time so far.
    """

    seconds: float = float("nan")

    def __enter__(self) -> Stopwatch:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start
