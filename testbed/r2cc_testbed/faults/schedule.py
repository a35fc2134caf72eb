"""The one scheduler of timed faults: what happens when, and undoing what was done.

    steps = expand(schedule.entries)      # a flap is 2 x count steps: down, then up half a period later
    play(steps, t0, do)                   # do(n, step) at t0 + step.at_s (time.monotonic())

    with HeldFaults(apply, rails) as held:   # faults kept in place, undone at the end whatever happens
        held.hold(spec)

Used by the lab's flap (FaultExecutor.flap), the load test's fault daemon (a round's schedule),
the bench (a fault at a moment of an op, or held for a launch) and the serving runs (a fault
held for a while during a load, every rail of a host down for an outage).
"""

from __future__ import annotations

import dataclasses
import threading
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


# --- faults held, and undone whatever happens ----------------------------------------------------

# Puts one fault or admin action in place; a flap may be started in the background and its
# thread returned (undo waits for it: a flap ends with the link up).
Apply = Callable[[FaultSpec, bool], "threading.Thread | None"]


class HeldFaults:
    """Faults put in place and kept until undone: undo() (and leaving the with block, also on an
    error) waits for a flap still running, then undoes each fault on every rail it touched (its
    FaultSpec.undo), once. apply(spec, background) carries one out (a lab's, a control plane's)."""

    def __init__(self, apply: Apply, rails: int, on_error: Callable[[FaultSpec, Exception], None] | None = None):
        self._apply, self._rails = apply, rails
        self._on_error = on_error  # undoing goes on after a failure; without this, the first is raised at the end
        self._held: list[list] = []  # [spec, its flap thread or None]
        self._lock = threading.Lock()

    @classmethod
    def on_lab(cls, lab, on_error: Callable[[FaultSpec, Exception], None] | None = None) -> "HeldFaults":
        """Faults of a Lab (lab/lab.py), put in place and undone by its inject."""
        return cls(lambda spec, background: lab.inject(spec, background=background), lab.rails, on_error)

    def hold(self, spec: FaultSpec, background: bool = False) -> threading.Thread | None:
        """Put spec in place (a flap in the background if asked: its thread is returned). Held
        from the moment it is asked for: a fault whose apply failed halfway is undone too."""
        entry = [spec, None]
        with self._lock:
            self._held.append(entry)
        entry[1] = self._apply(spec, background)
        return entry[1]

    def undo(self, flap_grace_s: float = 5.0) -> None:
        """Undo every held fault, in the order they were held, each rail on its own: a failure
        is passed to on_error (or raised once the others are undone)."""
        with self._lock:
            held, self._held = self._held, []
        for spec, thread in held:
            if thread is not None:  # a flap ends with the link up; let it finish first
                thread.join(timeout=spec.duration_s + flap_grace_s)
        undo_faults([spec for spec, _ in held], self._apply, self._rails, self._on_error)

    def __enter__(self) -> "HeldFaults":
        return self

    def __exit__(self, *exc) -> None:
        self.undo()


def undo_faults(specs: Iterable[FaultSpec], apply: Apply, rails: int,
                on_error: Callable[[FaultSpec, Exception], None] | None = None) -> None:
    """Undo each of specs on every rail it touched (FaultSpec.undo), in order, through apply; a
    failure is passed to on_error and the rest are still undone (without on_error the first
    failure is raised once they are)."""
    first_error = None
    for spec in specs:
        for undo in spec.undo(rails):
            try:
                apply(undo, False)
            except Exception as exc:  # noqa: BLE001 - the other rails are still restored
                if on_error is None:
                    first_error = first_error or exc
                else:
                    on_error(undo, exc)
    if first_error is not None:
        raise first_error
