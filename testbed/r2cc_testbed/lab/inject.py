"""Fault injection on one host's rail: down/up, blackhole, lossy, gray, marginal, degrade, flap, clear.

testbed/r2cc_testbed/faults/model.py says what the kinds are and how they are written; this is how the lab
does them. Each fault acts on the host's own end of the rail (what a NIC or cable fault looks
like from that server) and is recorded in the state file, so `status` and `clear` know what is
active.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from r2cc_testbed.faults.model import FaultSpec
from r2cc_testbed.lab import netns, shaping, state
from r2cc_testbed.lab.layout import Layout
from r2cc_testbed.lab.nft_rules import clear_scripts, fault_scripts
from r2cc_serve.util.rates import check_rate
from r2cc_testbed.lab.netns import LabError

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Target:
    """One host's end of one rail, and the state file that records its faults.

    The state path and lab id are fixed here rather than read from the environment on each
    write, so a background flap records into its own lab's file whatever happens to the env,
    and stops instead of flapping a newer lab built under the same names.
    """
    layout: Layout
    host: int
    rail: int
    state_path: str
    lab_id: str

    @property
    def ns(self) -> str:
        return self.layout.host_ns(self.host)

    @property
    def dev(self) -> str:
        return self.layout.rail_ifname(self.rail)

    def record(self, kind: str, value=True) -> None:
        state.set_fault(self.host, self.rail, kind, value, lab_id=self.lab_id, path=self.state_path)

    def forget(self, kinds: tuple[str, ...] | None = None, host: int | None = None) -> None:
        host = self.host if host is None else host
        state.clear_fault(host, self.rail, kinds, lab_id=self.lab_id, path=self.state_path)

    def lab_is_current(self) -> bool:
        return state.is_current(self.lab_id, self.state_path)


def link_down(t: Target) -> None:
    netns.ip(t.ns, "link", "set", t.dev, "down")
    t.record("down")


def link_up(t: Target) -> None:
    netns.ip(t.ns, "link", "set", t.dev, "up")
    t.forget(("down",))


def nft_fault(t: Target, spec: FaultSpec, mtu: int) -> None:
    """Drop packets of the host's rail with nftables (nft_rules.fault_scripts); the link stays up.

    blackhole: every IP packet in and out, like a dead switch port. lossy: a share of them each
    way, at random. gray: every packet longer than BYTES in its direction, like an MTU mismatch.
    marginal: a share of those longer than 1000 bytes, like a marginal optic. The peer sees
    silence (no reset, no unreachable) for what is dropped: TCP notices only through timeouts
    and retransmissions. Each fault's tables are replaced in one transaction: idempotent.
    """
    for ns, script in fault_scripts(t.layout, spec, mtu):
        netns.nft(ns, script)
    t.record(spec.kind, _recorded(spec))


def _recorded(spec: FaultSpec):
    """What the state file keeps of an nftables fault (`status` shows it as the fault's arg)."""
    if spec.kind == "blackhole":
        return True
    if spec.kind == "lossy":
        return spec.loss_pct
    size = {"direction": spec.direction, "max_bytes": spec.max_bytes}
    return size if spec.kind == "gray" else {"loss_pct": spec.loss_pct, **size}


def degrade(t: Target, rate: str) -> None:
    rate = check_rate(rate)
    shaping.set_link_rate(t.layout, t.host, t.rail, rate)
    t.record("degrade", rate)


def clear(t: Target, lab_rate: str | None) -> None:
    """Undo every fault on host's rail: no blackhole or loss, link up, the lab's original shaping."""
    for ns, script in clear_scripts(t.layout, t.host, t.rail):
        netns.nft(ns, script)
    netns.ip(t.ns, "link", "set", t.dev, "up")
    shaping.set_link_rate(t.layout, t.host, t.rail, lab_rate)
    t.forget()
    if not t.layout.switched:
        # With two hosts both ends share one link: its shaping is restored for the peer too.
        t.forget(("degrade",), host=1 - t.host)


def flap(t: Target, period_ms: int, count: int, progress: Progress | None = None) -> None:
    """count times: link down, wait period/2, link up, wait period/2. Ends with the link up."""
    say = progress or (lambda _msg: None)
    half = period_ms / 2000.0
    t.record("flap", {"period_ms": period_ms, "count": count})
    try:
        for n in range(1, count + 1):
            if not t.lab_is_current():
                raise LabError(f"flap of h{t.host} {t.dev} stopped: the lab was torn down")
            link_down(t)
            say(f"flap {n}/{count}: h{t.host} {t.dev} down")
            time.sleep(half)
            link_up(t)
            say(f"flap {n}/{count}: h{t.host} {t.dev} up")
            time.sleep(half)
    finally:
        t.forget(("flap",))


class FlapThread(threading.Thread):
    """A background flap; `error` holds the LabError that stopped it early, if any."""

    def __init__(self, t: Target, period_ms: int, count: int, progress: Progress | None):
        super().__init__(name=f"r2cc-lab-flap-h{t.host}-rail{t.rail}", daemon=True)
        self._args = (t, period_ms, count, progress)
        self.error: LabError | None = None

    def run(self) -> None:
        try:
            flap(*self._args)
        except LabError as exc:  # e.g. the lab was torn down mid-flap
            self.error = exc
