"""Percentiles and the bootstrap confidence interval of a percentile's overhead. Pure (numpy).

Overhead of percentile p: for each pair of rounds (fault-free, then faulted, run back to back),
the ratio p(faulted) / p(fault-free); the overhead is the geometric mean of those ratios - 1, so
a slow drift of the machine between pairs cancels. Its 95% interval comes from a two-level
bootstrap: pairs are drawn with replacement (what is left of the round-to-round noise), then,
inside each drawn round, requests are drawn with replacement (the spread within a round). A request is one unit
also for ITL, whose values are that request's gaps: gaps of one request are not independent.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from r2cc_serve.util.percentile import percentile  # noqa: F401 (the one percentile, re-exported)

WIDE = 0.10  # an interval wider than 10 points cannot resolve the few percent asked about
# With fewer pairs the bootstrap draws requests only: the interval leaves out the round-to-round
# noise (a busy machine moved one round's p99 by 60% here) and looks far more certain than it is.
MIN_PAIRS = 3




class Units:
    """The values of one round, grouped by request (a request may hold several, e.g. its ITLs)."""

    def __init__(self, groups: list[list[float]]):
        groups = [g for g in groups if len(g)]
        self.lengths = np.array([len(g) for g in groups], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64) if groups else \
            np.zeros(0, dtype=np.int64)
        self.flat = np.concatenate([np.asarray(g, dtype=float) for g in groups]) if groups else np.zeros(0)

    def __len__(self) -> int:
        return len(self.lengths)

    def resample(self, rng: np.random.Generator) -> np.ndarray:
        """The values of len(self) requests drawn with replacement."""
        idx = rng.integers(0, len(self), size=len(self))
        lens, starts = self.lengths[idx], self.starts[idx]
        ends = np.cumsum(lens)
        pos = np.arange(ends[-1]) - np.repeat(ends - lens, lens) + np.repeat(starts, lens)
        return self.flat[pos]


@dataclass
class Overhead:
    percentile: int
    free: float | None
    fault: float | None
    overhead: float | None  # fault / free - 1
    low: float | None       # 95% interval
    high: float | None
    pairs: int

    def to_dict(self) -> dict:
        return self.__dict__.copy()


def overheads(pairs: list[tuple[Units, Units]], percentiles=(50, 90, 99), n_boot: int = 2000,
              seed: int = 0) -> list[Overhead]:
    """One Overhead per percentile from (fault-free, faulted) pairs of rounds.

    Each pair gives a ratio of percentiles (adjacent rounds: drift between pairs cancels); the
    overhead is their geometric mean - 1, and `free`/`fault` are the pooled percentiles."""
    pairs = [(a, b) for a, b in pairs if len(a) and len(b)]
    if not pairs:
        return [Overhead(p, None, None, None, None, None, 0) for p in percentiles]
    free = np.percentile(np.concatenate([a.flat for a, _ in pairs]), percentiles)
    fault = np.percentile(np.concatenate([b.flat for _, b in pairs]), percentiles)
    point = _mean_log_ratio([(np.percentile(a.flat, percentiles), np.percentile(b.flat, percentiles)) for a, b in pairs])
    rng = np.random.default_rng(seed)
    draws = np.empty((n_boot, len(percentiles)))
    for i in range(n_boot):
        chosen = [pairs[j] for j in rng.integers(0, len(pairs), size=len(pairs))]
        draws[i] = _mean_log_ratio([(np.percentile(a.resample(rng), percentiles),
                                     np.percentile(b.resample(rng), percentiles)) for a, b in chosen])
    low, high = np.percentile(np.expm1(draws), [2.5, 97.5], axis=0) if n_boot else (free * np.nan, free * np.nan)
    return [Overhead(p, float(free[k]), float(fault[k]), float(np.expm1(point[k])), _f(low[k]), _f(high[k]),
                     len(pairs)) for k, p in enumerate(percentiles)]


def _mean_log_ratio(per_pair: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.mean([np.log(b / a) for a, b in per_pair], axis=0)


def verdict(o: Overhead, target: float | None = None) -> str:
    """What the interval allows one to say, in words."""
    if o.overhead is None:
        return "no data"
    if o.low is None or o.high is None:
        return "no interval"
    if o.pairs < MIN_PAIRS:
        return f"not decided: {o.pairs} pair(s); the interval holds no round-to-round noise (run {MIN_PAIRS}+)"
    if target is not None:
        if o.high <= target:
            return f"meets the {target:.0%} target"
        if o.low > target:
            return f"exceeds the {target:.0%} target"
        return f"undecided: the interval is too wide to decide against {target:.0%}"
    if o.low > 0:
        return "slower"
    if o.high < 0:
        return "faster"
    if o.high - o.low > WIDE:
        return "too wide to decide"
    return "no significant change"


def _f(x) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)
