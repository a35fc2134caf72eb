"""A serving run with a fault in it, and its verdict: same tokens, no failures, failover seen.

    ref = run_load(dep.url, dep.model, spec)                      # fault-free reference
    out = run_with_fault(dep, FaultSpec("blackhole", rail=2, after_s=3, hold_s=5), spec, ref)
    assert not out.problems(), out.problems()

The load runs for the fault's whole window (duration mode) so requests are in flight when
the rail breaks and when it comes back. The fault is held by FaultInjector: wait after_s,
inject, hold hold_s, undo. Lab kinds (down, blackhole, degrade, flap, all-down) change the lab
and are cleared at the end. Admin actions (drain, failover) go to the r2cc control agent of the
host's rank (address and token from its status file) and are undone by undrain / restore; the
link itself stays healthy. Used as a context manager so the rail is restored whatever happens
to the load:

    with FaultInjector(lab, FaultSpec("down", host=0, rail=1, after_s=3, hold_s=5)) as fi:
        result = run_load(...)
    fi.record  # injected_at / restored_at (time.time()) and any error

What a fault is: faults/model.py; holding and undoing it: faults/schedule.py.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from dataclasses import dataclass, field

from r2cc_serve.errors import UserError
from r2cc_testbed.faults.model import HELD_KINDS, FaultSpec, labelled, parse_fault_words, parse_timed
from r2cc_testbed.faults.timing import looks_like_notation
from r2cc_testbed.faults.schedule import HeldFaults
from r2cc_testbed.serving import control, evidence
from r2cc_testbed.serving.load import LoadResult, LoadSpec, compare, run_load

RECOVER_WAIT_S = 20.0  # a restored rail is probed every 200 ms; stale ARP can add ~1 s
# A rail that flapped is held out on purpose (flap dampening: R2CC_FLAP_HOLD_S after its last
# failure, doubled for each new hold while its penalty is high, restarted by a failure or loss
# seen during the hold): while a status file shows it held, the wait follows the hold's time
# left, up to this long after the restore.
RECOVER_HELD_MAX_S = 90.0


FAULT_HELP = "in the fault notation (docs/faults.md): h<HOST>:<RAIL>:<KIND>[:ARGS][@SECONDS][+SECONDS]"


def options_given(args, parts: dict[str, str]) -> dict[str, str]:
    """{part: option} of those options in parts ({"rail": "--rail"}) that the user set (not None)."""
    return {part: opt for part, opt in parts.items() if getattr(args, opt.lstrip("-").replace("-", "_")) is not None}


def parse_option(text: str, host: int, rail: int, after_s: float, hold_s: float,
                 given: dict[str, str] | None = None) -> FaultSpec:
    """`--fault` of the demo and serve-bench: the fault notation (h0:1:down@3s+5s; faults/timing.py),
    whose @ and + default to after_s and hold_s, or the older KIND[:ARGS] (down, flap:200:5,
    degrade:100mbit) on host's rail. given: the parts the user also set with options of their own,
    e.g. {"rail": "--rail", "after": "--after"}; the notation must not say them a second time."""
    label = f"--fault {text.strip()!r}"
    if not looks_like_notation(text):
        with labelled(label):
            spec = parse_fault_words(text.strip().split(":"), host, rail, HELD_KINDS)
            return dataclasses.replace(spec, after_s=after_s, hold_s=hold_s)
    timed = parse_timed(text, HELD_KINDS, label=label)
    said = {"host": True, "rail": True, "after": timed.spec.after_s is not None, "hold": timed.spec.hold_s is not None}
    twice = [opt for part, opt in (given or {}).items() if said.get(part)]
    if twice:
        raise UserError(f"{label} already says what {', '.join(twice)} would: give it once")
    return timed.with_defaults(after_s, hold_s)


def check_held(spec: FaultSpec, lab) -> FaultSpec:
    """UserError unless spec is a fault this module can hold and undo inside the lab."""
    with labelled(f"fault {spec.text}"):
        if spec.kind not in HELD_KINDS:
            raise UserError(f"{spec.kind} cannot be held and undone: use one of {', '.join(HELD_KINDS)}")
        if spec.after_s is None or spec.hold_s is None:
            raise UserError("a held fault needs after_s and hold_s")
        return spec.check_target(lab.hosts, lab.rails)


@dataclass
class FaultRecord:
    spec: FaultSpec
    inject_started_at: float | None = None  # time.time() just before the kernel change
    injected_at: float | None = None         # time.time() right after it
    restored_at: float | None = None
    errors: list[str] = field(default_factory=list)
    mid_fault: object = None  # what the `during` probe saw halfway through the hold


class FaultInjector:
    def __init__(self, lab, spec: FaultSpec, progress=None, status_dir: str | None = None, during=None):
        """status_dir: R2CC_STATUS_DIR of the deployment (admin actions need it to find the agents).
        during: optional zero-argument probe called halfway through the hold (e.g. read health)."""
        self._during = during
        self.lab, self.spec = lab, check_held(spec, lab)
        self.status_dir = status_dir
        if spec.is_admin:
            control.agent_of_rank(status_dir, spec.host)  # fails now, not mid-load
        self.record = FaultRecord(spec)
        self._say = progress or (lambda m: print(f"[fault] {m}", file=sys.stderr, flush=True))
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, name="r2cc-serving-fault", daemon=True)
        self._held = HeldFaults(self._apply, lab.rails, on_error=self._restore_failed)
        self._injected = False

    def __enter__(self) -> "FaultInjector":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._cancel.set()  # ends the hold early if the load finished or failed first
        self._thread.join(timeout=self.spec.hold_s + 30)
        if self._thread.is_alive() or (self._injected and self.record.restored_at is None):
            self._restore()  # never leave a broken rail behind

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the fault was injected and restored (the load may still be running)."""
        self._thread.join(timeout_s)

    def _run(self) -> None:
        if self._cancel.wait(self.spec.after_s):
            return
        try:
            self._inject()
        except Exception as exc:  # reported with the result, and the rail is restored
            self.record.errors.append(f"inject: {type(exc).__name__}: {exc}")
        if self._cancel.wait(self.spec.hold_s / 2):
            self._restore()
            return
        if self._during is not None and self.record.injected_at is not None:
            try:
                self.record.mid_fault = self._during()
            except Exception as exc:  # a probe failure must not keep the rail broken
                self.record.mid_fault = f"probe failed: {type(exc).__name__}: {exc}"
        self._cancel.wait(self.spec.hold_s / 2)
        self._restore()

    def _inject(self) -> None:
        self._injected = True
        self.record.inject_started_at = time.time()
        self._held.hold(self.spec, background=True)
        self.record.injected_at = time.time()
        self._say(f"injected {self.spec.text}")

    def _apply(self, spec: FaultSpec, background: bool = False) -> threading.Thread | None:
        if spec.is_admin:
            control.rail_action(self.status_dir, spec.host, spec.rail, spec.kind)
            return None
        return self.lab.inject(spec, background=background)

    def _restore(self) -> None:
        if not self._injected or self.record.restored_at is not None:
            return
        self._held.undo(flap_grace_s=10)  # a flap is let finish first (it ends with the link up)
        self.record.restored_at = time.time()
        self._say(f"restored {self.spec.target}")

    def _restore_failed(self, undo: FaultSpec, exc: Exception) -> None:
        self.record.errors.append(f"restore rail{undo.rail}: {type(exc).__name__}: {exc}")


@dataclass
class FaultOutcome:
    spec: FaultSpec
    load: LoadResult
    record: FaultRecord
    mismatches: list[str]
    target_rails: list[int]
    faulted: list[evidence.Transition]   # transitions of the broken rail(s), both ranks
    noise: list[evidence.Transition]     # transitions of the other rails in the same window
    detect_s: float | None               # first "up -> not up" of a broken rail after the fault
    core_detect_s: float | None          # the core's own detection latency of that event (status file)
    recover_s: float | None              # last broken (rank, rail) back "up", after the restore
    recovered: bool
    tokens_during_fault: int             # tokens streamed while the fault was active
    status_delta: dict[int, dict] = field(default_factory=dict)  # per rail, from status files
    # Not recovered: what each broken (rank, rail) last logged, and what the status files say now
    unrecovered: dict[str, str] = field(default_factory=dict)

    def problems(self) -> list[str]:
        """Why this run does not show lossless failover ([] when it does)."""
        out = [f"{len(self.load.failed)} request(s) failed: {self.load.failed[0].error}"] if self.load.failed else []
        out += [f"output differs from the fault-free reference: {m}" for m in self.mismatches[:3]]
        out += [f"fault injection: {e}" for e in self.record.errors]
        if self.record.injected_at is None:
            out.append("the fault was never injected (the load ended first?)")
            return out
        if self.spec.kind == "degrade":  # a slower rail stays in service: no failover to look for
            return out + self._overlap_problems()
        failovers = sum(self.status_delta.get(r, {}).get("failovers", 0) for r in self.target_rails)
        if not self._went_down() and failovers == 0:
            out.append(f"no failover seen on rail(s) {self.target_rails}: no state change in the logs "
                       "and no failover counted in the status files")
        if self.spec.kind != "flap" and isinstance(self.record.mid_fault, dict):
            # Halfway through the hold the broken rails must be out of use on some rank.
            states = [r.get("rails", {}) for r in self.record.mid_fault.get("r2cc", {}).values()]
            still_up = [k for k in self.target_rails if states and all(s.get(k) == "up" for s in states)]
            if still_up:
                out.append(f"halfway through the fault rail(s) {still_up} were still 'up' on every rank")
        if not self.recovered:
            out.append(f"rail(s) {self.target_rails} not back up within {RECOVER_WAIT_S:.0f} s of the restore "
                       f"(or of the end of a flap hold, {RECOVER_HELD_MAX_S:.0f} s at most)")
        return out + self._overlap_problems()

    def _overlap_problems(self) -> list[str]:
        if self.tokens_during_fault == 0:
            return ["no token was streamed while the fault was active: the load did not overlap it"]
        return []

    def _went_down(self) -> bool:
        return any(t.old == "up" and t.new != "up" for t in self.faulted)

    def report(self) -> str:
        """summary() as indented JSON, whole (a test's failure message: a dict there is cut short)."""
        return json.dumps(self.summary(), indent=1, default=str)

    def summary(self) -> dict:
        s = self.load.summary()
        s.update({
            "fault": self.spec.text, "mismatches": len(self.mismatches),
            "detect_s": _r(self.detect_s), "core_detect_s": _r(self.core_detect_s),
            "recover_s": _r(self.recover_s), "recovered": self.recovered,
            "faulted_transitions": len(self.faulted), "other_rail_transitions": len(self.noise),
            "tokens_during_fault": self.tokens_during_fault, "mid_fault": self.record.mid_fault,
            "fault_reasons": sorted({t.reason.split(" (")[0][:60] for t in self.faulted if t.new == "down"})[:4],
        })
        if self.status_delta:
            s["rails"] = self.status_delta
        if self.unrecovered:
            s["unrecovered"] = self.unrecovered
        return s


def run_with_fault(dep, spec: FaultSpec, load_spec: LoadSpec, reference: LoadResult,
                   progress=None) -> FaultOutcome:
    """Run `load_spec` for the whole fault window on `dep`, inject `spec`, judge the result."""
    spec = check_held(spec, dep.lab)
    load_spec = dataclasses.replace(load_spec, duration_s=spec.after_s + spec.hold_s + 3.0)
    targets = spec.target_rails(dep.lab.rails)
    status_before = evidence.rail_totals(evidence.read_status_now(dep.status_dir))
    with evidence.LogWatcher(dep.logs) as watch:
        with FaultInjector(dep.lab, spec, progress, status_dir=dep.status_dir,
                           during=lambda: health_snapshot(dep)) as injector:
            result = run_load(dep.url, dep.model, load_spec)
            injector.wait(timeout_s=spec.after_s + spec.hold_s + 60)
        rec = injector.record
        recovered, recover_s, last_logged = _wait_recovered(watch, targets, rec, dep.status_dir)
        status_after = evidence.read_status_now(dep.status_dir)
    unrecovered = {} if recovered else _unrecovered(last_logged, status_after, targets)
    end = time.time()
    start = rec.inject_started_at or result.started_at
    # Status-file events carry the monitor's own time stamps; the log watcher is the fallback.
    events = [t for t in evidence.status_transitions(status_after) if start <= t.seen_at <= end]
    window = events or watch.between(start, end)
    faulted = [t for t in window if t.rail in targets]
    first_down = next((t for t in faulted if t.old == "up" and t.new != "up"), None)
    totals_after = evidence.rail_totals(status_after)
    return FaultOutcome(
        spec=spec, load=result, record=rec, mismatches=compare(reference, result), target_rails=targets,
        faulted=faulted, noise=[t for t in window if t.rail not in targets],
        detect_s=None if first_down is None else first_down.seen_at - start,
        core_detect_s=None if first_down is None else first_down.detect_s,
        recover_s=recover_s, recovered=recovered,
        tokens_during_fault=len(result.gaps(rec.injected_at, rec.restored_at)) if rec.injected_at else 0,
        status_delta=evidence.diff_totals(status_before, totals_after) if totals_after else {},
        unrecovered=unrecovered,
    )


def health_snapshot(dep) -> dict:
    """vLLM's /health code and each r2cc rank's health status (ok / degraded / down) right now."""
    import httpx

    try:
        code = httpx.get(f"{dep.url}/health", timeout=5.0, trust_env=False).status_code
    except httpx.HTTPError as exc:
        code = f"no answer ({type(exc).__name__})"
    ranks = {f"rank{d.get('rank')}": {"status": d.get("status"), "reasons": (d.get("reasons") or [])[:3],
                                      "rails": {int(r["rail"]): r["state"] for r in d.get("rails") or []}}
             for d in evidence.read_status(dep.status_dir).values()}
    return {"vllm_health": code, "r2cc": ranks}


def _wait_recovered(watch: evidence.LogWatcher, targets: list[int], rec: FaultRecord,
                    status_dir: str | None) -> tuple[bool, float | None, dict[tuple[int, int], evidence.Transition]]:
    """Wait until every (rank, rail) of the broken rails that left "up" is "up" again; also
    returns each one's last logged transition."""
    last: dict[tuple[int, int], evidence.Transition] = {}
    if rec.restored_at is None:
        return False, None, last
    deadline = rec.restored_at + RECOVER_WAIT_S
    while True:
        last = {}
        for t in watch.between(rec.inject_started_at):
            if t.rail in targets:
                last[(t.rank, t.rail)] = t
        if all(t.new == "up" for t in last.values()):
            ups = [t.seen_at for t in last.values()]
            return True, max(0.0, max(ups) - rec.restored_at) if ups else 0.0, last
        now = time.time()
        if now > deadline:
            held_left = _hold_left_s(status_dir, targets) if status_dir else 0.0
            if held_left <= 0 or now > rec.restored_at + RECOVER_HELD_MAX_S:
                return False, None, last
            deadline = min(now + held_left + 5.0, rec.restored_at + RECOVER_HELD_MAX_S)
        time.sleep(0.2)


def _hold_left_s(status_dir: str, targets: list[int]) -> float:
    """The longest flap or loss hold still running on the broken rails, by the status files."""
    left = [float(r.get("hold_left_s") or 0) for doc in evidence.read_status(status_dir).values()
            for r in doc.get("rails") or [] if int(r.get("rail", -1)) in targets and r.get("state") == "held"]
    return max(left, default=0.0)


def _unrecovered(last_logged: dict[tuple[int, int], evidence.Transition], status: dict[str, dict],
                 targets: list[int]) -> dict[str, str]:
    """Why a broken rail counts as not back: its last logged change and its state in the status
    files (what an operator would look at first)."""
    out = {f"rank{r} rail{k} last logged": f"{t.old} -> {t.new} ({t.reason[:120]})"
           for (r, k), t in sorted(last_logged.items()) if t.new != "up"}
    out.update({f"{where} status file": why for where, why in evidence.rails_not_up(status, targets).items()})
    return out


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)
