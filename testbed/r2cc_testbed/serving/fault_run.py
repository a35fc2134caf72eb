"""One fault-during-generation run and its verdict: same tokens, no failures, failover seen.

    ref = run_load(dep.url, dep.model, spec)                      # fault-free reference
    out = run_with_fault(dep, FaultSpec("blackhole", rail=2, after_s=3, hold_s=5), spec, ref)
    assert not out.problems(), out.problems()

The load runs for the fault's whole window (duration mode) so requests are in flight when
the rail breaks and when it comes back.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field

from r2cc_testbed.faults.model import FaultSpec
from r2cc_testbed.serving import evidence
from r2cc_testbed.serving.fault_hold import FaultInjector, FaultRecord, check_held
from r2cc_testbed.serving.load import LoadResult, LoadSpec, compare, run_load

RECOVER_WAIT_S = 20.0  # a restored rail is probed every 200 ms; stale ARP can add ~1 s
# A rail that flapped is held out on purpose (flap dampening: R2CC_FLAP_HOLD_S after its last
# failure, doubled for each new hold while its penalty is high, restarted by a failure or loss
# seen during the hold): while a status file shows it held, the wait follows the hold's time
# left, up to this long after the restore.
RECOVER_HELD_MAX_S = 90.0


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
