"""How long collectives take: a histogram cheap enough for every call (admin metrics read it)."""

from __future__ import annotations


class DurationHistogram:
    """Counts of collective durations per upper bound (seconds); cheap enough for the hot path."""

    BOUNDS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

    def __init__(self):
        self.counts = [0] * (len(self.BOUNDS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        i = 0
        while i < len(self.BOUNDS) and seconds > self.BOUNDS[i]:
            i += 1
        self.counts[i] += 1
        self.total += seconds

    def snapshot(self) -> dict:
        return {"bounds": list(self.BOUNDS), "counts": list(self.counts), "sum": self.total}
