"""The one scheduler of timed faults: what happens when, and undoing what was done.

    steps = expand(schedule.entries)      # a flap is 2 x count steps: down, then up half a period later
    play(steps, t0, do)                   # do(n, step) at t0 + step.at_s (time.monotonic())

Used by the lab's flap (FaultExecutor.flap), the load test's fault daemon (a round's schedule),
the bench (a fault at a moment of an op, or held for a launch) and the serving runs (a fault
held for a while during a load, every rail of a host down for an outage).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

from r2cc_testbed.faults.model import FaultSpec


@dataclass
class Step:
    """One kernel change or admin call at one moment: a flap is 2 x count steps."""
    entry: int          # index in the schedule
    at_s: float         # seconds after t0 it is due
    kind: str           # down, up, blackhole, clear, degrade, lossy, gray, marginal, all-down, drain, ...
    host: int
    rail: int | None
    rate: str | None = None
    loss_pct: float | None = None
    direction: str | None = None  # gray, marginal
    max_bytes: int | None = None  # gray, marginal
    label: str = ""     # what a person reads: "down h0 rail1", "flap 2/50 up h0 rail1"

    def fault(self) -> FaultSpec:
        """The one fault or admin action this step carries out."""
        return FaultSpec(self.kind, self.host, self.rail, rate=self.rate, loss_pct=self.loss_pct,
                         direction=self.direction, max_bytes=self.max_bytes)


def expand(entries: Iterable[FaultSpec]) -> list[Step]:
    """Steps of timed faults (each entry's after_s is when it is due) in time order (pure)."""
    steps = []
    for n, spec in enumerate(entries):
        target = spec.target
        if spec.kind == "flap":
            half = spec.period_ms / 2000.0
            for i in range(spec.count):
                base = spec.after_s + i * spec.period_ms / 1000.0
                steps.append(Step(n, base, "down", spec.host, spec.rail, label=f"flap {i + 1}/{spec.count} down {target}"))
                steps.append(Step(n, base + half, "up", spec.host, spec.rail, label=f"flap {i + 1}/{spec.count} up {target}"))
        else:
            steps.append(Step(n, spec.after_s, spec.kind, spec.host, spec.rail, spec.rate, spec.loss_pct,
                              spec.direction, spec.max_bytes, f"{spec.action} {target}"))
    return sorted(steps, key=lambda s: (s.at_s, s.entry))


class Timed(Protocol):
    at_s: float


def sleep_until(due: float) -> str | None:
    """The plain way to wait for a step: sleep until due (time.monotonic()); never stops early."""
    time.sleep(max(0.0, due - time.monotonic()))
    return None


def play(steps: list[Timed], t0: float, do: Callable[[int, Timed], None],
         wait_until: Callable[[float], str | None] = sleep_until) -> str:
    """do(n, step) for each step at t0 + step.at_s (time.monotonic()), in order; a step that is
    late is done at once, and never moves the ones after it. wait_until(due) waits and returns
    None, or why the schedule stops there (e.g. "aborted"), which play returns; else "finished"."""
    for n, step in enumerate(steps):
        if (stop := wait_until(t0 + step.at_s)) is not None:
            return stop
        do(n, step)
    return "finished"


def flap_steps(spec: FaultSpec) -> list[Step]:
    """A flap's steps, timed from its start."""
    return expand([dataclasses.replace(spec, after_s=0.0)])


def play_flap(spec: FaultSpec, do: Callable[[int, Step], None]) -> None:
    """Play a flap's steps from now (do(n, step) for each), and return once its last cycle is over:
    count x period after the start, with the link up for the last half period."""
    t0 = time.monotonic()
    play(flap_steps(spec), t0, do)
    sleep_until(t0 + spec.duration_s)
