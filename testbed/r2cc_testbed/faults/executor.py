"""The one way a lab fault reaches the kernel: FaultExecutor.apply and FaultExecutor.clear.

Exactly one place maps a fault kind to kernel actions: FaultExecutor.apply below. How each
action is made is up to the implementation:
  lab_executor.LabExecutor              starts `ip`, `tc` and `nft` for each change and records the
                                        fault in the lab's state file (`r2cc lab fault`, Lab.inject)
  inprocess_executor.InProcessExecutor  starts nothing per change: link flags through namespace
                                        sockets, libnftables in-process, one `tc -batch` process per
                                        namespace (the load test's fault daemon)

Both calls are idempotent: applying a fault again leaves it as it was (links are set, nftables
tables replaced whole, qdiscs replaced), and clear undoes every lab fault of a rail whether or not
one is in place. A flap is timed by the one schedule of timed faults (schedule.expand).
"""

from __future__ import annotations

from typing import Callable

from r2cc_testbed.faults.model import HOST_FAULTS, LAB_KINDS, FaultSpec
from r2cc_testbed.faults.schedule import play_flap
from r2cc_testbed.lab.layout import Layout
from r2cc_testbed.lab.netns import LabError
from r2cc_testbed.lab.nft_rules import NFT_FAULTS, clear_scripts, fault_scripts

# Holds once the kernel shows a change (None: nothing to watch for).
Check = Callable[[], bool]
LAB_DOES = LAB_KINDS + HOST_FAULTS  # admin actions go through r2cc's control plane instead


class FaultExecutor:
    """Lab faults on one lab's hosts and rails. Subclasses make the kernel changes:
    set_link, run_nft, set_rate (and restore_rate, flap, the noted/cleared records if they keep any)."""

    def __init__(self, layout: Layout, lab_rate: str | None, mtu: int | None):
        self.layout, self.lab_rate, self.mtu = layout, lab_rate, mtu

    # --- the interface ---------------------------------------------------------------------

    def apply(self, spec: FaultSpec) -> Check | None:
        """Put spec in place (all-down: down on every data rail); idempotent. Returns a check
        that the kernel shows the change, when the executor can watch for it."""
        if spec.kind not in LAB_DOES:
            raise LabError(f"{spec.kind} is not a lab fault: the lab does {', '.join(LAB_DOES)}")
        return _all([self._apply_one(step) for step in spec.per_rail(self.layout.rails)])

    def clear(self, host: int, rail: int) -> Check | None:
        """Undo every lab fault on host's rail: no nftables fault, link up, the lab's own shaping.
        Idempotent, and harmless on a rail with no fault."""
        for ns, script in clear_scripts(self.layout, host, rail):
            self.run_nft(ns, script)
        check = self.set_link(host, rail, up=True)
        self.restore_rate(host, rail)
        self.cleared(host, rail)
        return check

    # --- the one kind-to-action map --------------------------------------------------------

    def _apply_one(self, spec: FaultSpec) -> Check | None:
        check = None
        if spec.kind in ("down", "up"):
            check = self.set_link(spec.host, spec.rail, up=spec.kind == "up")
        elif spec.kind in NFT_FAULTS:
            for ns, script in fault_scripts(self.layout, spec, self.mtu):
                self.run_nft(ns, script)
        elif spec.kind == "degrade":
            self.set_rate(spec.host, spec.rail, spec.rate)
        elif spec.kind == "clear":
            return self.clear(spec.host, spec.rail)
        elif spec.kind == "flap":
            self.flap(spec)
            return None
        else:
            raise LabError(f"{spec.kind} is not a one-rail lab fault")
        self.noted(spec)
        return check

    # --- what an implementation provides ---------------------------------------------------

    def set_link(self, host: int, rail: int, up: bool) -> Check | None:
        """Set host's end of rail down or up."""
        raise NotImplementedError

    def run_nft(self, ns: str, script: str) -> None:
        """Load one nftables script (one transaction) in namespace ns."""
        raise NotImplementedError

    def set_rate(self, host: int, rail: int, rate: str | None) -> None:
        """Shape both directions of host's rail to rate (None: unshaped)."""
        raise NotImplementedError

    def restore_rate(self, host: int, rail: int) -> None:
        """Give host's rail the lab's own shaping back."""
        self.set_rate(host, rail, self.lab_rate)

    def flap(self, spec: FaultSpec) -> None:
        """spec.count cycles of down and up, timed by the schedule of timed faults; ends with the link up."""
        play_flap(spec, lambda _n, step: self.apply(step.fault()))

    def noted(self, spec: FaultSpec) -> None:
        """Called once a one-rail fault (or up) is in place; keeps no record by default."""

    def cleared(self, host: int, rail: int) -> None:
        """Called once host's rail is cleared; keeps no record by default."""


def _all(checks: list[Check | None]) -> Check | None:
    watched = [c for c in checks if c is not None]
    if not watched:
        return None
    return watched[0] if len(watched) == 1 else (lambda: all(c() for c in watched))
