"""The bench driver: lab up, one launch per backend (plus fault launches), report, lab down.

Order, all in one invocation so every backend sees the same machine state:
  1. per backend: one launch measuring every size fault-free. r2cc also runs, per fault spec,
     a baseline on R-1 rails (the failed rail excluded) and then one faulted op per size.
  2. gloo/mpi faults: one fresh launch per (spec, size), since a fail-stop library cannot go on
     after the fault; the fault lands at the same fraction of *their* fault-free p50.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field

from r2cc_serve import envs
from r2cc_testbed.results import build_info
from r2cc_testbed.bench import launch as launch_mod
from r2cc_testbed.bench import results as rep
from r2cc_testbed.bench.fault_handshake import FaultHandshake, HeldForLaunch
from r2cc_testbed.bench.launch import say
from r2cc_testbed.bench.spec import FLOOR, BenchFault, format_size
from r2cc_serve.util.rates import rate_bits

STARTUP_S = 60.0  # group set-up budget (gloo/MPI connect, r2cc handshakes) per launch


@dataclass
class BenchOptions:
    hosts: int
    rails: int
    rate: str | None
    mtu: int
    op: str
    sizes: list[int]
    backends: list[str]
    iters: int
    warmup: int
    faults: list[BenchFault] = field(default_factory=list)
    timeout_s: float = 300.0  # one measure task (all iterations of one size)
    fault_timeout_s: float = 20.0  # one faulted op (or follow-up)
    followups: int | None = None  # ops after the faulted one, fault still active (None: one per rail)
    fault_reps: int = 1  # r2cc faulted ops per (spec, size); the report gives their median
    keep_lab: bool = False
    schedules: list[str] = field(default_factory=list)  # r2cc all_reduce schedules measured side by side
    holds: list[BenchFault] = field(default_factory=list)  # faults held for the whole r2cc launch
    hold_traffic_s: float = 0.0  # bulk traffic after the held faults are in place, before measuring
    warmup_s: float = 0.0  # warm-up repeated until this long (rank 0's clock decides for all)
    first_calls: int = 0  # calls of a fresh group timed apart, before any warm-up (first size only)
    spin_us: int | None = None  # R2CC_SPIN_US for the r2cc ranks (None: the caller's environment)


def _counter_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Counters that moved, without the MPTcpExt prefix."""
    return {k.removeprefix("MPTcpExt"): v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


class Bench:
    def __init__(self, opts: BenchOptions, hosts):
        """hosts: where the ranks run (bench/hosts.py: the lab, or servers that already exist)."""
        self.o = opts
        self.hosts = hosts
        self.rails = self.hosts.rails
        self.skipped: list[dict] = []  # backends these hosts cannot run: {"backend", "reason"}
        self.followups = opts.rails if opts.followups is None else opts.followups
        self._names = itertools.count()
        self._live: list[launch_mod.Launch] = []
        self._ctls: list[FaultHandshake] = []

    # ---- public ------------------------------------------------------------------------
    def run(self) -> dict:
        o = self.o
        self.tmp = tempfile.mkdtemp(prefix="r2cc-bench-")
        try:
            self.store = self.hosts.open()
            self.skipped = list(self.hosts.skipped)
            results, faults = [], []
            for backend in o.backends:
                if backend in {x["backend"] for x in self.skipped}:
                    continue
                r, f = self._main_launch(backend)
                results += r
                faults += f
            for backend in o.backends:
                if backend not in ("r2cc", FLOOR):  # the floor has no failover to measure
                    faults += self._fault_launches(backend, results)
            rep.add_ratios(results)
            rep.add_free_extras(results, faults)
            report = {"op": o.op, "hosts": o.hosts, "rails": o.rails, "rate": o.rate, "mtu": o.mtu,
                      "iters": o.iters, "warmup": o.warmup, "warmup_s": o.warmup_s, "first_calls": o.first_calls,
                      "results": results, "faults": faults,
                      "held_faults": [h.text for h in o.holds], "schedules": o.schedules,
                      "skipped": self.skipped,
                      "spin_us": o.spin_us if o.spin_us is not None else envs.get("R2CC_SPIN_US"),
                      "load_avg": list(os.getloadavg()),
                      "build": build_info()}
            if o.schedules:
                from r2cc_testbed.bench.expect import add_expectations
                add_expectations(report)
            return report
        finally:
            self._cleanup()

    # ---- launches ----------------------------------------------------------------------
    def _main_launch(self, backend: str) -> tuple[list[dict], list[dict]]:
        schedules = (self.o.schedules or [None]) if backend == "r2cc" else [None]
        tasks = [{"kind": "measure", "size": s, "schedules": self.o.schedules if backend == "r2cc" else []}
                 for s in self.o.sizes]
        fault_tasks = []
        # With held faults or a schedule list the faulted call runs a planned path on a degraded
        # group: a group on one rail fewer plans differently, so it is no baseline; the faulted
        # call is set against the fault-free call of the same plan instead.
        same_plan = bool(self.o.holds or self.o.schedules)
        if backend == "r2cc":
            n, measured = 0, set()
            for spec in self.o.faults:
                rail = spec.fault.rail
                if rail not in measured and not same_plan:  # the R-1 rail baseline, once per failed rail
                    measured.add(rail)
                    tasks += [{"kind": "baseline", "size": s, "exclude_rail": rail} for s in self.o.sizes]
                for s in self.o.sizes:
                    for _ in range(self.o.fault_reps):
                        fault_tasks.append({"kind": "fault", "size": s, "n": n, "spec": spec.to_dict(),
                                            "delay_s": None})
                        n += 1
                tasks += fault_tasks[-len(self.o.sizes) * self.o.fault_reps:]
        per_rank, ctl = self._launch(backend, tasks, fault_tasks)
        results = [rep.summarize_measure(backend, self.o.op, self.o.hosts, s,
                                         self._entries(per_rank, "measure", s, schedule=k), schedule=k)
                   for s in self.o.sizes for k in schedules]
        faults, reps = [], self.o.fault_reps
        for i in range(0, len(fault_tasks), reps):
            t = fault_tasks[i]
            if same_plan:
                base_s, kind = self._same_plan_p50(results, t["size"])
            else:
                base = rep.summarize_measure(backend, self.o.op, self.o.hosts, t["size"],
                                             self._entries(per_rank, "baseline", t["size"], rail=t["spec"]["fault"]["rail"]))
                base_s, kind = base["p50_s"], f"r2cc on {self.o.rails - 1} rails"
            rows = [rep.summarize_fault(backend, t["spec"]["text"], t["size"],
                                        self._entries(per_rank, "fault", t["size"], n=u["n"]),
                                        ctl.injected.get(u["n"]), base_s, kind)
                    for u in fault_tasks[i:i + reps]]
            faults.append(rep.merge_reps(rows))
        return results, faults

    def _same_plan_p50(self, results: list[dict], size: int) -> tuple[float | None, str]:
        """The fault-free p50 of what a faulted r2cc call runs: the configured schedule
        (R2CC_SCHEDULE, `auto` unless set), measured in the same launch with the held faults."""
        configured = envs.get("R2CC_SCHEDULE")
        rows = [r for r in results if r["bytes"] == size and r["backend"] == "r2cc"]
        row = next((r for r in rows if r.get("schedule") == configured), None) or \
            next((r for r in rows if not r.get("schedule")), None)
        if row is None:
            return None, f"none: add {configured} to --schedule to measure the faulted call's own plan fault-free"
        held = " with the held faults" if self.o.holds else ""
        return row["p50_s"], f"r2cc fault-free, same plan ({row.get('schedule') or configured}){held}"

    def _fault_launches(self, backend: str, results: list[dict]) -> list[dict]:
        out = []
        for spec in self.o.faults:
            for s in self.o.sizes:
                p50 = next((r["p50_s"] for r in results if r["backend"] == backend and r["bytes"] == s), None)
                if p50 is None:
                    say(f"{backend} {format_size(s)}: no fault-free time, skipping fault {spec.text}")
                    continue
                task = {"kind": "fault", "size": s, "n": 0, "spec": spec.to_dict(), "delay_s": spec.at * p50,
                        "last": True}
                kernel0 = self.hosts.mptcp_counters() if backend.endswith("-mptcp") else None
                per_rank, ctl = self._launch(backend, [task], [task])
                row = rep.summarize_fault(backend, spec.text, s, self._entries(per_rank, "fault", s, n=0),
                                          ctl.injected.get(0), p50, f"{backend} fault-free, all rails")
                if kernel0 is not None:
                    # MPTCP keeps no record of its own the way r2cc does: the kernel's counters
                    # (subflows marked stale, data re-injected on another subflow) say what it did.
                    row["kernel_mptcp"] = _counter_delta(kernel0, self.hosts.mptcp_counters())
                out.append(row)
        return out

    def _launch(self, backend: str, tasks: list[dict], fault_tasks: list[dict]):
        o = self.o
        name = f"{backend}{next(self._names)}"
        per_fault = (o.fault_timeout_s + 5) * (1 + self.followups)  # the worker watchdog allows +5 s per op
        budget = STARTUP_S + sum(o.timeout_s * max(1, len(t.get("schedules") or [])) if t["kind"] != "fault"
                                 else o.timeout_s + per_fault + 30 for t in tasks)
        cfg = {"launch": name, "backend": backend, "op": o.op, "world": o.hosts, "rails": self.rails,
               "iters": o.iters, "warmup": o.warmup, "warmup_s": o.warmup_s, "first_calls": o.first_calls,
               "tasks": tasks, "followups": self.followups,
               "store_host": self.hosts.store_host, "store_port": self.store.port, "out_dir": self.tmp,
               "parent_pid": os.getpid(), "startup_s": STARTUP_S, "deadline_s": budget,
               # gloo raises after this; a fault launch must not wait minutes for it.
               "timeout_s": o.fault_timeout_s if fault_tasks and backend != "r2cc" else o.timeout_s,
               "fault_timeout_s": o.fault_timeout_s,
               "hold": bool(o.holds) and backend == "r2cc", "hold_traffic_s": o.hold_traffic_s,
               # The planner's nominal rail rate: the lab's real one, so auto decides with true numbers.
               "rail_Bps": rate_bits(o.rate) / 8 if o.rate else None}
        cfg_path = os.path.join(self.tmp, f"{name}.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        sizes = ", ".join(format_size(t["size"]) for t in tasks if t["kind"] == "measure")
        what = f"sizes {sizes}" if sizes else f"fault {fault_tasks[0]['spec']['text']} at {format_size(tasks[0]['size'])}"
        say(f"{backend}: starting {o.hosts} ranks ({what}{', then faults' if sizes and fault_tasks else ''})")
        la = self.hosts.start(name, cfg_path, self.tmp, backend, o.spin_us)
        self._live.append(la)
        from torch.distributed import PrefixStore
        ctl = FaultHandshake(self.hosts.lab, PrefixStore(name + "/", self.store), o.hosts, fault_tasks,
                              done_timeout_s=per_fault + 10)
        held = HeldForLaunch(self.hosts.lab, PrefixStore(name + "/", self.store), o.holds if cfg["hold"] else [])
        self._ctls += [ctl, held]

        def poll() -> None:
            ctl.poll()
            held.poll()
        # Faults and held faults are timed from here; without them the ranks only need to be
        # watched for their exit, and a 10 ms poll (a store round trip each) preempted a timed
        # call of either backend ~100 times a second on a 2-core host.
        interval = 0.01 if fault_tasks or cfg["hold"] else 0.2
        try:
            finished = launch_mod.wait(la, time.monotonic() + budget + 15, poll, interval)
            if not finished:
                say(f"{backend}: launch {name} passed its {budget + 15:.0f} s budget; killing it")
        finally:
            la.kill()
            ctl.finish()
            held.finish()
            self._live.remove(la)
        per_rank = self.hosts.gather(la, STARTUP_S + budget)
        for r, res in enumerate(per_rank):
            if res is None:
                say(f"{backend} rank {r}: no results file")
            elif res.get("error"):
                say(f"{backend} rank {r}: {res['error']}")
        return per_rank, ctl

    @staticmethod
    def _entries(per_rank, kind, size, n=None, rail=None, schedule=None):
        """Each rank's entry for one task (a stand-in carrying the rank's error if it has none)."""
        out = []
        for res in per_rank:
            match = None
            for e in (res or {}).get("tasks", []):
                if (e["kind"], e["size"]) == (kind, size) and (n is None or e.get("n") == n) \
                        and (rail is None or e.get("exclude_rail") == rail) and e.get("schedule") == schedule:
                    match = e
            if match is None and res is not None and res.get("error"):
                match = {"error": res["error"]}
            out.append(match)
        return out

    def _cleanup(self) -> None:
        for la in list(self._live):
            la.kill()
        for ctl in self._ctls:
            try:
                ctl.finish()
            except Exception as exc:
                say(f"could not clear a fault: {exc}")
        if getattr(self, "store", None) is not None:
            del self.store
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.hosts.close()
