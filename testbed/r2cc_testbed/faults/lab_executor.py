"""The lab's fault executor: each change by a command (`ip`, `tc`, `nft`), each fault recorded.

Each fault acts on the host's own end of the rail (what a NIC or cable fault looks like from
that server) and is recorded in the lab's state file, so `r2cc lab status` and `clear` know what
is active. What a kind does is FaultExecutor.apply's (executor.py); this is how the lab does it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from r2cc_testbed.faults.executor import Check, FaultExecutor
from r2cc_testbed.faults.model import FaultSpec
from r2cc_testbed.faults.schedule import Step, play_flap
from r2cc_testbed.lab import netns, shaping, state
from r2cc_testbed.lab.layout import Layout
from r2cc_testbed.lab.netns import LabError

Progress = Callable[[str], None]


@dataclass(frozen=True)
class LabRecord:
    """The state file that records one lab's faults.

    The path and lab id are fixed here rather than read from the environment on each write, so
    a background flap records into its own lab's file whatever happens to the env, and stops
    instead of flapping a newer lab built under the same names.
    """
    state_path: str
    lab_id: str

    def record(self, host: int, rail: int, kind: str, value=True) -> None:
        state.set_fault(host, rail, kind, value, lab_id=self.lab_id, path=self.state_path)

    def forget(self, host: int, rail: int, kinds: tuple[str, ...] | None = None) -> None:
        state.clear_fault(host, rail, kinds, lab_id=self.lab_id, path=self.state_path)

    def lab_is_current(self) -> bool:
        return state.is_current(self.lab_id, self.state_path)


class LabExecutor(FaultExecutor):
    """Lab faults by `ip`, `tc` and `nft` commands, recorded in the lab's state file."""

    def __init__(self, layout: Layout, lab_rate: str | None, mtu: int | None, record: LabRecord,
                 progress: Progress | None = None):
        super().__init__(layout, lab_rate, mtu)
        self.record = record
        self._say = progress or (lambda _msg: None)

    def set_link(self, host: int, rail: int, up: bool) -> Check | None:
        netns.ip(self.layout.host_ns(host), "link", "set", self.layout.rail_ifname(rail), "up" if up else "down")
        return None

    def run_nft(self, ns: str, script: str) -> None:
        netns.nft(ns, script)

    def set_rate(self, host: int, rail: int, rate: str | None) -> None:
        shaping.set_link_rate(self.layout, host, rail, rate)

    def noted(self, spec: FaultSpec) -> None:
        if spec.kind == "up":
            self.record.forget(spec.host, spec.rail, ("down",))
        else:
            self.record.record(spec.host, spec.rail, spec.kind, _recorded(spec))

    def cleared(self, host: int, rail: int) -> None:
        self.record.forget(host, rail)
        if not self.layout.switched:
            # With two hosts both ends share one link: its shaping is restored for the peer too.
            self.record.forget(1 - host, rail, ("degrade",))

    def flap(self, spec: FaultSpec) -> None:
        """count times: link down, half a period later up, half a period later the next cycle;
        recorded as a flap while it runs, and stopped (LabError) if the lab is torn down meanwhile."""
        dev = self.layout.rail_ifname(spec.rail)
        self.record.record(spec.host, spec.rail, "flap", {"period_ms": spec.period_ms, "count": spec.count})

        def step(n: int, s: Step) -> None:
            if s.kind == "down" and not self.record.lab_is_current():
                raise LabError(f"flap of h{spec.host} {dev} stopped: the lab was torn down")
            self.apply(s.fault())
            self._say(f"flap {n // 2 + 1}/{spec.count}: h{spec.host} {dev} {s.kind}")

        try:
            play_flap(spec, step)
        finally:
            self.record.forget(spec.host, spec.rail, ("flap",))


def _recorded(spec: FaultSpec):
    """What the state file keeps of a fault (`status` shows it as the fault's arg)."""
    if spec.kind == "degrade":
        return spec.rate
    if spec.kind in ("down", "blackhole"):
        return True
    if spec.kind == "lossy":
        return spec.loss_pct
    size = {"direction": spec.direction, "max_bytes": spec.max_bytes}
    return size if spec.kind == "gray" else {"loss_pct": spec.loss_pct, **size}


class FlapThread(threading.Thread):
    """A flap in the background; `error` holds the LabError that stopped it early, if any."""

    def __init__(self, executor: FaultExecutor, spec: FaultSpec):
        super().__init__(name=f"r2cc-lab-flap-h{spec.host}-rail{spec.rail}", daemon=True)
        self._executor, self._spec = executor, spec
        self.error: LabError | None = None

    def run(self) -> None:
        try:
            self._executor.apply(self._spec)
        except LabError as exc:  # e.g. the lab was torn down mid-flap
            self.error = exc
