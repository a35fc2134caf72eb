"""The share of a decode step each vLLM worker spends inside collectives, timed the same way for
every backend (serve-bench; issue 47).

Off by default: serving pays nothing. With R2CC_STEP_SHARE_DIR set (serve-bench sets it, one
directory per deployment), plugin.register() calls install() in every vLLM process:

- every blocking collective of vLLM's GroupCoordinator (compat.GROUP_COLLECTIVES: all_reduce,
  all_gather, gather, ...) is timed from entry to return, whatever runs under it (r2cc's
  communicator, or vLLM's CPU one over gloo or shared memory);
- a step is the worker's execute_model and the sample_tokens that may follow it
  (compat.time_worker_steps). Only collectives called inside one, on its thread, count: not
  start-up, profiling runs or admin RPCs; a collective inside another counts once;
- three clocks each: wall (time.perf_counter), the calling thread's CPU (time.thread_time) and
  the whole process's CPU (time.process_time, which also sees helper threads: r2cc's rail
  threads, the gloo process group's worker threads);
- steps are kept apart by kind: "decode" (every scheduled request got one token) and "prefill"
  (some request got more: a prompt chunk, beside decodes or alone).

Each worker writes its running totals to <dir>/rank<R>.json, atomically, after a step and at
most every WRITE_INTERVAL_S, with what one timed call costs (overhead_per_call_s, measured in
the worker). serve-bench reads the files before and after a round and `window` takes the
difference: the steps between two snapshots, which may begin and end up to WRITE_INTERVAL_S
before the round does (a round is many seconds of one load, so the share does not move).

Eager mode only (serve-bench's default): under torch.compile vLLM's own backend is traced into the
graph through these methods, where no clock reaches it, while r2cc's, behind a custom op, would
still be timed.
"""

from __future__ import annotations

import functools
import glob
import json
import logging
import os
import re
import threading
import time
from typing import Callable

log = logging.getLogger("r2cc_serve.vllm")

KINDS = ("decode", "prefill")
WRITE_INTERVAL_S = 0.5
# Per kind: steps, their time by the three clocks, the same inside collectives, calls.
FIELDS = ("steps", "wall_s", "cpu_s", "proc_cpu_s", "coll_wall_s", "coll_cpu_s", "coll_proc_cpu_s", "calls")
_FILE_RE = re.compile(r"rank(\d+)\.json$")


def step_kind(requests: int, tokens: int) -> str | None:
    """"decode" (one token per request), "prefill" (a prompt chunk somewhere), None (no forward pass)."""
    if tokens <= 0:
        return None
    return "decode" if tokens == requests else "prefill"


class _Step:
    """One step's time (wall, thread CPU, process CPU), the same inside collectives, and its calls."""

    __slots__ = ("kind", "time", "coll", "calls", "ops")

    def __init__(self, kind: str):
        self.kind = kind
        self.time = [0.0, 0.0, 0.0]
        self.coll = [0.0, 0.0, 0.0]
        self.calls = 0
        self.ops: dict[str, int] = {}


def _zero() -> dict:
    return {**dict.fromkeys(FIELDS, 0), "ops": {}}


class StepClock:
    """Totals of one worker process: steps and the collectives inside them, by kind.

    `clocks` are (wall, thread CPU, process CPU), each a function returning seconds; tests pass
    fakes. A worker has one RPC thread, which runs its steps; `collective` and `step_start` /
    `step_end` return the wrappers vLLM's methods are replaced by."""

    def __init__(self, path: str | None = None,
                 clocks: tuple[Callable[[], float], ...] = (time.perf_counter, time.thread_time, time.process_time)):
        self.path = path  # where write() puts the totals (install() names it after the worker's rank)
        self.rank: int | None = None
        self.clocks = clocks
        self.totals = {k: _zero() for k in KINDS}
        self.overhead_per_call_s: float | None = None
        self._step: _Step | None = None  # running, or waiting for its sample_tokens
        self._thread: int | None = None  # the thread inside a step call now
        self._busy = False                # inside a timed collective
        self._written_at = float("-inf")

    # --- the wrappers -----------------------------------------------------------------------------

    def collective(self, fn: Callable) -> Callable:
        wall, cpu, proc = self.clocks
        ident = threading.get_ident
        name = fn.__name__

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if self._thread is None or self._busy or ident() != self._thread:
                return fn(*args, **kwargs)
            self._busy = True
            p0, c0, w0 = proc(), cpu(), wall()
            try:
                return fn(*args, **kwargs)
            finally:
                w1, c1, p1 = wall(), cpu(), proc()
                s = self._step
                s.coll[0] += w1 - w0
                s.coll[1] += c1 - c0
                s.coll[2] += p1 - p0
                s.calls += 1
                s.ops[name] = s.ops.get(name, 0) + 1
                self._busy = False

        return timed

    def step_start(self, fn: Callable, kind_of: Callable[..., str | None]) -> Callable:
        """execute_model: begins a step of kind_of(*args) (None: not a step, run untimed) and ends
        it unless it returned None (then sample_tokens ends it)."""
        return self._step_call(fn, kind_of)

    def step_end(self, fn: Callable) -> Callable:
        """sample_tokens: the rest of the step execute_model began; ends it."""
        return self._step_call(fn, None)

    def _step_call(self, fn: Callable, kind_of: Callable[..., str | None] | None) -> Callable:
        wall, cpu, proc = self.clocks
        ident = threading.get_ident

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if self._thread is not None:  # a step call inside a step call: part of the outer one
                return fn(*args, **kwargs)
            if kind_of is not None:
                self._end()  # a step whose sample_tokens never came
                kind = kind_of(*args, **kwargs)
                if kind is None:
                    return fn(*args, **kwargs)
                self._step = _Step(kind)
            elif self._step is None:
                return fn(*args, **kwargs)
            s = self._step
            self._thread = ident()
            ok = False
            p0, c0, w0 = proc(), cpu(), wall()
            try:
                out = fn(*args, **kwargs)
                ok = True
                return out
            finally:
                w1, c1, p1 = wall(), cpu(), proc()
                self._thread = None
                s.time[0] += w1 - w0
                s.time[1] += c1 - c0
                s.time[2] += p1 - p0
                if not ok:
                    self._step = None  # a step that raised is not a step of the load
                elif kind_of is None or out is not None:
                    self._end()

        return timed

    # --- totals ----------------------------------------------------------------------------------

    def _end(self) -> None:
        s, self._step = self._step, None
        if s is None:
            return
        t = self.totals[s.kind]
        t["steps"] += 1
        for i, k in enumerate(("wall_s", "cpu_s", "proc_cpu_s")):
            t[k] += s.time[i]
        for i, k in enumerate(("coll_wall_s", "coll_cpu_s", "coll_proc_cpu_s")):
            t[k] += s.coll[i]
        t["calls"] += s.calls
        for name, n in s.ops.items():
            t["ops"][name] = t["ops"].get(name, 0) + n
        now = self.clocks[0]()
        if self.path and now - self._written_at >= WRITE_INTERVAL_S:
            self._written_at = now
            self.write()

    def snapshot(self) -> dict:
        return {"rank": self.rank, "pid": os.getpid(), "time": time.time(),
                "overhead_per_call_s": self.overhead_per_call_s,
                "kinds": {k: {**v, "ops": dict(v["ops"])} for k, v in self.totals.items()}}

    def write(self) -> None:
        """The totals to self.path, atomically (a reader never sees half a file)."""
        if self.overhead_per_call_s is None:
            self.overhead_per_call_s = self.measure_overhead()
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(self.snapshot(), f)
            os.replace(tmp, self.path)
        except OSError as exc:  # the deployment's directory going away at shutdown
            log.debug("r2cc: step share not written to %s: %s", self.path, exc)

    def measure_overhead(self, calls: int = 2000, repeats: int = 3) -> float:
        """Seconds one timed collective costs its caller beyond the call itself (the clocks and
        the book-keeping), measured here on a function that does nothing: best of `repeats`."""
        def nothing():
            return None

        timed = self.collective(nothing)
        saved = self._step, self._thread, self._busy
        self._step, self._thread, self._busy = _Step("calibration"), threading.get_ident(), False
        best = float("inf")
        try:
            for _ in range(repeats):
                t0 = time.perf_counter()
                for _ in range(calls):
                    nothing()
                t1 = time.perf_counter()
                for _ in range(calls):
                    timed()
                t2 = time.perf_counter()
                best = min(best, ((t2 - t1) - (t1 - t0)) / calls)
        finally:
            self._step, self._thread, self._busy = saved
        return max(best, 0.0)


# --- in a vLLM process ------------------------------------------------------------------------------

_installed: StepClock | None = None


def install(directory: str) -> StepClock:
    """Time this process's steps and collectives into <directory>/rank<R>.json (idempotent)."""
    global _installed
    if _installed is not None:
        return _installed
    from r2cc_serve.vllm import compat

    clock = StepClock()

    def kind_of(worker, scheduler_output, *args, **kwargs):
        if clock.path is None:
            clock.rank = compat.worker_rank(worker)
            clock.path = os.path.join(directory, f"rank{clock.rank}.json")
        return step_kind(*compat.step_tokens(scheduler_output))

    compat.time_group_collectives(clock.collective)
    compat.time_worker_steps(lambda fn: clock.step_start(fn, kind_of), clock.step_end)
    _installed = clock
    return clock


# --- in serve-bench ---------------------------------------------------------------------------------


def read_dir(directory: str | None) -> dict[int, dict]:
    """{rank: the worker's last snapshot} of every rank<R>.json in directory (none: {})."""
    out = {}
    for path in glob.glob(os.path.join(directory, "rank*.json")) if directory else []:
        m = _FILE_RE.search(path)
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            continue
        if m:
            out[int(m[1])] = doc
    return out


def _diff(after: dict, before: dict | None) -> dict:
    before = before or _zero()
    out = {k: after.get(k, 0) - before.get(k, 0) for k in FIELDS}
    ops_before = before.get("ops", {})
    out["ops"] = {k: v - ops_before.get(k, 0) for k, v in after.get("ops", {}).items() if v - ops_before.get(k, 0)}
    return out


def _sum(totals: list[dict]) -> dict:
    out = _zero()
    for t in totals:
        for k in FIELDS:
            out[k] += t[k]
        for name, n in t["ops"].items():
            out["ops"][name] = out["ops"].get(name, 0) + n
    return out


def per_step(t: dict) -> dict:
    """What the totals of some steps mean per step: wall seconds inside collectives and in the whole
    step, the same in thread CPU and in process CPU, the shares of the step's wall, thread-CPU and
    process-CPU time spent inside collectives, and calls per step (None where there was no step or
    no time)."""
    n = t["steps"]

    def share(part: str, whole: str):
        return round(t[part] / t[whole], 4) if n and t[whole] > 0 else None

    def per(key: str, digits: int = 6):
        return round(t[key] / n, digits) if n else None

    return {"steps": n, "calls_per_step": per("calls", 2),
            "coll_s_per_step": per("coll_wall_s"), "step_s": per("wall_s"),
            "coll_cpu_s_per_step": per("coll_cpu_s"), "step_cpu_s": per("cpu_s"),
            "coll_proc_cpu_s_per_step": per("coll_proc_cpu_s"), "step_proc_cpu_s": per("proc_cpu_s"),
            "wall_share": share("coll_wall_s", "wall_s"), "cpu_share": share("coll_cpu_s", "cpu_s"),
            "proc_cpu_share": share("coll_proc_cpu_s", "proc_cpu_s"),
            "ops_per_step": {k: round(v / n, 2) for k, v in sorted(t["ops"].items())} if n else {}}


def window(before: dict[int, dict], after: dict[int, dict]) -> dict[str, dict]:
    """Per rank ("0", "1", ...): per_step of the decode steps and of all steps between two
    read_dir results, and the worker's own overhead per timed call (microseconds)."""
    out = {}
    for rank, doc in sorted(after.items()):
        old = before.get(rank, {})
        if old.get("pid") not in (None, doc.get("pid")):
            old = {}  # another process (a restarted worker): its totals started again
        kinds = {k: _diff(doc["kinds"].get(k, _zero()), old.get("kinds", {}).get(k)) for k in KINDS}
        overhead = doc.get("overhead_per_call_s")
        out[str(rank)] = {"decode": per_step(kinds["decode"]), "all": per_step(_sum(list(kinds.values()))),
                          "overhead_us_per_call": None if overhead is None else round(overhead * 1e6, 2)}
    return out
