"""One fault-during-generation run and its verdict: same tokens, no failures, failover seen.

    ref = run_load(dep.url, dep.model, spec)                      # fault-free reference
    out = run_with_fault(dep, FaultSpec("blackhole", rail=2, after_s=3, hold_s=5), spec, ref)
    assert not out.problems(), out.problems()

The load runs for the fault's whole window (duration mode) so requests are in flight when
the rail breaks and when it comes back.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from r2cc_serve.testbed.faults import FaultSpec
from r2cc_serve.testbed.serving import evidence
from r2cc_serve.testbed.serving.fault_hold import FaultInjector, FaultRecord, check_held
from r2cc_serve.testbed.serving.load import LoadResult, LoadSpec, compare, run_load

RECOVER_WAIT_S = 20.0  # a restored rail is probed every 200 ms; stale ARP can add ~1 s


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
            out.append(f"rail(s) {self.target_rails} not back up within {RECOVER_WAIT_S:.0f} s of the restore")
        return out + self._overlap_problems()

    def _overlap_problems(self) -> list[str]:
        if self.tokens_during_fault == 0:
            return ["no token was streamed while the fault was active: the load did not overlap it"]
        return []

    def _went_down(self) -> bool:
        return any(t.old == "up" and t.new != "up" for t in self.faulted)

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
        recovered, recover_s = _wait_recovered(watch, targets, rec)
        status_after = evidence.read_status_now(dep.status_dir)
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


def _wait_recovered(watch: evidence.LogWatcher, targets: list[int], rec: FaultRecord) -> tuple[bool, float | None]:
    """Wait until every (rank, rail) of the broken rails that left "up" is "up" again."""
    if rec.restored_at is None:
        return False, None
    deadline = rec.restored_at + RECOVER_WAIT_S
    while True:
        last: dict[tuple[int, int], evidence.Transition] = {}
        for t in watch.between(rec.inject_started_at):
            if t.rail in targets:
                last[(t.rank, t.rail)] = t
        if all(t.new == "up" for t in last.values()):
            ups = [t.seen_at for t in last.values()]
            return True, max(0.0, max(ups) - rec.restored_at) if ups else 0.0
        if time.time() > deadline:
            return False, None
        time.sleep(0.2)


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)
