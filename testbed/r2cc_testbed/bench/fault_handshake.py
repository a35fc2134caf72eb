"""Parent side of the fault hand-shake (see worker.py): inject at the right moment, then clear.

poll() is called every few ms while a launch runs; it never blocks longer than one fault
delay. Every fault that was injected is cleared, also when the launch dies or is killed: the
faults are held by the scheduler of timed faults (faults/schedule.py), which undoes them.
"""

from __future__ import annotations

import json
import sys
import time

from r2cc_testbed.bench.spec import BenchFault
from r2cc_testbed.faults.schedule import HeldFaults


class FaultHandshake:
    """The faults of a launch's fault tasks, each injected when the workers ask and cleared once
    they are done with it."""

    def __init__(self, lab, store, world: int, fault_tasks: list[dict], done_timeout_s: float):
        self.lab, self.store, self.world = lab, store, world
        self.tasks = fault_tasks  # in the order the workers run them
        self.done_timeout_s = done_timeout_s
        self.injected: dict[int, dict] = {}  # n -> {"go", "injected_at", "cleared_at", "error"}
        self._i = 0
        self._active = None  # (n, held fault, deadline)

    def poll(self) -> None:
        if self._active is not None:
            n, _held, deadline = self._active
            if int(self.store.add(f"fault/{n}/done", 0)) >= self.world or time.monotonic() > deadline:
                self._clear()
            return
        if self._i >= len(self.tasks):
            return
        task = self.tasks[self._i]
        n = task["n"]
        if not self.store.check([f"fault/{n}/req"]):
            return
        delay = float(json.loads(self.store.get(f"fault/{n}/req"))["delay_s"])
        spec = BenchFault.from_dict(task["spec"])
        self.store.set(f"fault/{n}/go", "1")
        go = time.time()
        time.sleep(max(0.0, go + delay - time.time()))
        # The kernel change happens somewhere inside lab.inject (it execs `ip`/`nft`, tens of ms
        # on a loaded box): keep both ends; injected_at (the end) is when it surely happened.
        record = {"go": go, "delay_s": delay, "call_start": time.time(), "injected_at": None, "error": None}
        self.injected[n] = record
        held = HeldFaults.on_lab(self.lab)
        try:
            held.hold(spec.fault, background=True)
            record["injected_at"] = time.time()
        except Exception as exc:  # a lab failure is reported with the fault, not fatal
            record["error"] = f"{type(exc).__name__}: {exc}"
            print(f"[bench] fault {spec.text} could not be injected: {exc}", file=sys.stderr, flush=True)
        self._active = (n, held, time.monotonic() + self.done_timeout_s)
        self._i += 1

    def _clear(self) -> None:
        n, held, _ = self._active
        self._active = None
        held.undo()  # a flap is let finish first (it ends with the link up)
        self.injected[n]["cleared_at"] = time.time()
        self.store.set(f"fault/{n}/cleared", "1")

    def finish(self) -> None:
        """Clear a fault that is still active (the launch ended or was killed)."""
        if self._active is not None:
            self._clear()


class HeldForLaunch:
    """Faults held for a whole r2cc launch (--hold-fault): injected when rank 0 asks (hold/req,
    once the group is up), announced with hold/go, cleared when the launch ends."""

    def __init__(self, lab, store, holds: list[BenchFault]):
        self.lab, self.store, self.holds = lab, store, holds
        self._held: HeldFaults | None = None
        self._injected: list[BenchFault] = []
        self.error: str | None = None

    def poll(self) -> None:
        if self._held is not None or self.error or not self.holds or not self.store.check(["hold/req"]):
            return
        self._held = HeldFaults.on_lab(self.lab)
        drains = []
        for h in self.holds:
            if h.fault.kind == "drain":  # an admin action: the rank of that host does it
                drains.append([h.fault.host, h.fault.rail])
                continue
            try:
                self._held.hold(h.fault)
                self._injected.append(h)
            except Exception as exc:  # reported; the workers then measure without it
                self.error = f"{h.text}: {type(exc).__name__}: {exc}"
                print(f"[bench] held fault {self.error}", file=sys.stderr, flush=True)
        held = [h.text for h in self._injected] + [h.text for h in self.holds if h.fault.kind == "drain"]
        self.store.set("hold/go", json.dumps({"held": held, "drains": drains, "error": self.error}))

    def finish(self) -> None:
        if self._held is not None:
            self._held.undo()
