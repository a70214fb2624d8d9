"""When generation and training were busy, and how much of the run they overlapped (what asynchronous training buys).

Generation is busy while at least one request is at a vLLM server (:class:`~.weights.AdapterBackend` records it);
training is busy while a training process runs a forward/backward pass (:class:`~.trl_async.EnvkitAsyncGRPOTrainer`
records it on the main process). :func:`overlap` measures both and their intersection.
"""

from __future__ import annotations

import threading
import time


class Activity:
    """Busy intervals of something that may run several times at once (thread-safe): busy from the first
    :meth:`enter` while idle until the :meth:`exit` that leaves none running."""

    def __init__(self) -> None:
        self.intervals: list[tuple[float, float]] = []
        self._running = 0
        self._since = 0.0
        self._lock = threading.Lock()

    def enter(self) -> None:
        """One more is running."""
        with self._lock:
            if self._running == 0:
                self._since = time.perf_counter()
            self._running += 1

    def exit(self) -> None:
        """One fewer is running."""
        with self._lock:
            self._running -= 1
            if self._running == 0:
                self.intervals.append((self._since, time.perf_counter()))

    def busy_s(self, start: float = float("-inf"), end: float = float("inf")) -> float:
        """Seconds busy within ``[start, end]``."""
        return sum(max(0.0, min(b, end) - max(a, start)) for a, b in self.intervals)


def _intersection(first: list[tuple[float, float]], second: list[tuple[float, float]]) -> float:
    total, i, j = 0.0, 0, 0
    first, second = sorted(first), sorted(second)
    while i < len(first) and j < len(second):
        low, high = max(first[i][0], second[j][0]), min(first[i][1], second[j][1])
        total += max(0.0, high - low)
        if first[i][1] < second[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap(generation: Activity, training: Activity, start: float, end: float) -> dict[str, float]:
    """Within ``[start, end]`` (``time.perf_counter`` seconds): generation-busy, training-busy and both-busy seconds,
    and ``fraction`` = both-busy / wall time (0 when they never ran at once)."""

    def clip(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
        return [(max(a, start), min(b, end)) for a, b in intervals if min(b, end) > max(a, start)]

    gen, train = clip(generation.intervals), clip(training.intervals)
    both = _intersection(gen, train)
    wall = max(end - start, 1e-9)
    return {
        "wall_s": end - start,
        "generation_s": sum(b - a for a, b in gen),
        "training_s": sum(b - a for a, b in train),
        "both_s": both,
        "fraction": both / wall,
    }
