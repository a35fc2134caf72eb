"""Measured trials: the cost model proposes, the group's own clock decides.

The model knows bandwidth and a per-message cost, not how busy the CPUs are. On this 2-core
box, with four vLLM workers computing, OptCC's extra messages and stages cost far more than
the model charges: at 2 MiB it won 1.22x in `r2cc bench` (CPUs free) and lost 0.69x inside a
TP=4 prefill (CPUs saturated). So where the model prefers a plan to the baseline (what the
built-in path runs: one_shot up to R2CC_ALLREDUCE_ONE_SHOT_BYTES, else direct), the next
``calls`` calls of that size bucket alternate the two; then the ranks gather their medians
(one all_gather of two numbers each) and keep, until the table changes, the one whose slowest
rank was faster. A tie keeps the baseline.

Every rank makes the same calls, so trials start, alternate and end at the same calls on every
rank, and the decision, taken from the same gathered numbers, is the same everywhere. Pure
bookkeeping: the communicator times the calls and runs the gather.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from r2cc_serve.errors import UserError


@dataclass
class _Trial:
    modeled: str
    baseline: str
    times: dict = field(default_factory=dict)  # schedule -> seconds of each trial call
    calls: int = 0
    kept: str | None = None
    medians_s: tuple | None = None  # (modeled, baseline), slowest rank's, once decided


class Trials:
    """Per (size bucket, elem bytes, epoch): which schedule the next call runs, and the verdict."""

    def __init__(self, calls: int = 6) -> None:
        if calls < 0 or calls % 2:
            raise UserError(f"R2CC_PLAN_TRIAL_CALLS must be an even number >= 0 (0: trust the model), got {calls}")
        self.calls = calls
        self._trials: dict[tuple, _Trial] = {}

    def pick(self, key: tuple, modeled: str, baseline: str) -> str:
        """The schedule this call runs."""
        if modeled == baseline or not self.calls:
            return modeled
        t = self._trials.get(key)
        if t is None:
            t = self._trials[key] = _Trial(modeled, baseline, {modeled: [], baseline: []})
        if t.kept:
            return t.kept
        return modeled if t.calls % 2 == 0 else baseline

    def observe(self, key: tuple, schedule: str, seconds: float) -> bool:
        """Records a call; True when it completed the key's trial (the ranks must now gather)."""
        t = self._trials.get(key)
        if t is None or t.kept:
            return False
        t.times[schedule].append(seconds)
        t.calls += 1
        return t.calls == self.calls

    def my_medians_us(self, key: tuple) -> list[int]:
        """This rank's (modeled, baseline) medians in microseconds, for the gather."""
        t = self._trials[key]
        return [int(statistics.median(t.times[s]) * 1e6) for s in (t.modeled, t.baseline)]

    def decide(self, key: tuple, gathered_us: list[list[int]]) -> str:
        """Keeps the schedule whose slowest rank was faster; ``gathered_us``: every rank's medians."""
        t = self._trials[key]
        modeled_us = max(g[0] for g in gathered_us)
        baseline_us = max(g[1] for g in gathered_us)
        t.kept = t.modeled if modeled_us < baseline_us else t.baseline
        t.medians_s = (modeled_us / 1e6, baseline_us / 1e6)
        return t.kept

    def forget_before(self, epoch: int) -> None:
        """A new table makes every earlier verdict stale (keys end with their epoch)."""
        self._trials = {k: t for k, t in self._trials.items() if k[-1] >= epoch}

    def describe(self) -> list[dict]:
        return [{"size_bucket_bytes": 2 ** k[0], "elem_bytes": k[1], "modeled": t.modeled, "baseline": t.baseline,
                 "kept": t.kept, "modeled_s": t.medians_s[0] if t.medians_s else None,
                 "baseline_s": t.medians_s[1] if t.medians_s else None}
                for k, t in sorted(self._trials.items())]
