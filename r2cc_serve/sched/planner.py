"""Pick the fastest schedule for each collective and cache its plan.

Messages match by order, so every rank must run the same plan: every rank must give the planner
the same bandwidth table (e.g. the one rank 0 publishes each epoch). The planner quantizes it
(``Bandwidth.quantized``) so measurement noise neither splits ranks nor triggers re-planning; the
epoch advances only when the quantized table changes, and plans are cached by
(op, size bucket, epoch).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass

from r2cc_serve.errors import UserError
from r2cc_serve.sched import builders, cost
from r2cc_serve.sched.bandwidth import Bandwidth
from r2cc_serve.sched.ir import Plan

OPS = ("all_reduce",)
# Tie-break order: the simpler schedule wins an equal estimate (uniform bandwidth: direct, not optcc).
# r2ccl is a baseline for the simulator: optcc's shares are never worse, so it is not a candidate.
CANDIDATES = ("one_shot", "direct", "optcc", "ring")
PARTIAL_SUM_SCHEDULES = ("ring",)  # not bit-identical to the others: only beyond 16 ranks


@dataclass(frozen=True)
class Choice:
    schedule: str
    chunks: int
    seconds: float  # the model's estimate
    estimates: dict  # every candidate's estimate, for operators


def size_bucket(nbytes: int) -> int:
    """Bucket b holds sizes in (2^(b-1), 2^b]; the decision is made at 2^b."""
    return max(0, math.ceil(math.log2(max(nbytes, 1))))


def bandwidth_from_rails(rails_Bps: list[list[float]]) -> Bandwidth:
    """Per-rank table from each rank's healthy rails' measured bandwidth (both directions alike)."""
    per_rank = [float(sum(r)) for r in rails_Bps]
    return Bandwidth(per_rank, per_rank)


class Planner:
    """One per communicator group. Thread-safe; ``plan()`` is cheap after the first call per size."""

    def __init__(self, p: int, model: cost.CostModel = cost.CostModel(), force: str | None = None,
                 quantize_steps: int = 32, max_plans: int = 64, slice_bytes: int = builders.DEFAULT_SLICE_BYTES,
                 allow_partial_sums: bool = False) -> None:
        """``slice_bytes``: direct's pipeline slices (R2CC_PIPELINE_BYTES, as the built-in path).
        ``allow_partial_sums``: let a benchmark force ring in a small group (its bits differ)."""
        if p < 1:
            raise UserError(f"a group needs at least one rank, got {p}")
        if force is not None and force not in builders.SCHEDULES:
            raise UserError(f"forced schedule {force!r}: choose from {', '.join(builders.SCHEDULES)}")
        if force in PARTIAL_SUM_SCHEDULES and p <= 16 and not allow_partial_sums:
            raise UserError(f"{force} uses partial sums, so its bits differ from the other schedules; "
                            "groups of up to 16 ranks must stay bit-identical")
        self.p, self.model, self.force, self.steps = p, model, force, quantize_steps
        self.slice_bytes = slice_bytes
        self._lock = threading.Lock()
        self._bw = Bandwidth.uniform(p, 1.0)
        self._epoch = 0
        self._choices: dict[tuple, Choice] = {}
        self._plans: OrderedDict[tuple, Plan] = OrderedDict()
        self._max_plans = max_plans

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def bandwidth(self) -> Bandwidth:
        return self._bw

    def update_bandwidth(self, bw: Bandwidth) -> int:
        """Install a new table; returns the epoch (advanced only if the quantized table changed)."""
        if bw.p != self.p:
            raise UserError(f"bandwidth table has {bw.p} ranks, the group {self.p}")
        q = bw.quantized(self.steps)
        with self._lock:
            if q.key() != self._bw.key():
                self._bw = q
                self._epoch += 1
                self._choices.clear()
                self._plans.clear()
            return self._epoch

    def choose(self, op: str, nbytes: int, elem_bytes: int = 4) -> Choice:
        _check_op(op)
        key = (op, size_bucket(nbytes), elem_bytes, self._epoch)
        with self._lock:
            hit = self._choices.get(key)
        if hit:
            return hit
        choice = self._decide(2 ** key[1], elem_bytes)
        with self._lock:
            self._choices[key] = choice
        return choice

    def plan(self, op: str, count: int, elem_bytes: int = 4) -> Plan:
        """The plan every rank of the group runs for this call (same inputs -> same plan)."""
        choice = self.choose(op, count * elem_bytes, elem_bytes)
        key = (op, count, elem_bytes, self._epoch)
        with self._lock:
            if key in self._plans:
                self._plans.move_to_end(key)
                return self._plans[key]
            bw = self._bw
        plan = builders.build(choice.schedule, self.p, count, bw=bw, elem_bytes=elem_bytes, chunks=choice.chunks,
                              slice_bytes=self.slice_bytes)
        plan.info["epoch"] = self._epoch
        with self._lock:
            self._plans[key] = plan
            while len(self._plans) > self._max_plans:
                self._plans.popitem(last=False)
        return plan

    def describe(self) -> dict:
        """What operators see: epoch, per-rank bandwidth and the decisions made so far."""
        with self._lock:
            return {"epoch": self._epoch, "forced": self.force,
                    "bandwidth_Bps": {"out": self._bw.out_Bps.tolist(), "in": self._bw.in_Bps.tolist()},
                    "choices": [{"op": op, "size_bucket_bytes": 2 ** b, "elem_bytes": e, "schedule": c.schedule,
                                 "chunks": c.chunks, "estimate_s": c.seconds}
                                for (op, b, e, _), c in sorted(self._choices.items())]}

    def _decide(self, nbytes: int, elem_bytes: int) -> Choice:
        allowed = [s for s in CANDIDATES if self.p > 16 or s not in PARTIAL_SUM_SCHEDULES]
        if self.force:
            allowed = [self.force]
        ests = {s: cost.estimate(s, self._bw, nbytes, self.model, elem_bytes) for s in allowed}
        best = min(allowed, key=lambda s: (ests[s].seconds, allowed.index(s)))
        return Choice(best, ests[best].chunks, ests[best].seconds, {s: e.seconds for s, e in ests.items()})


def _check_op(op: str) -> None:
    if op not in OPS:
        raise UserError(f"the planner handles {', '.join(OPS)} so far, not {op!r}")
