"""Inject one lab fault while a load runs: wait T seconds, break a rail, hold, restore.

Kinds:
  down       host's end of the rail link down (the NIC/cable dies; sender sees ENETUNREACH)
  blackhole  nftables drops everything on the rail; the link stays up (a dead switch port)
  flap       link down/up every period_ms/2, `count` times (a bad cable)
  all-down   every data rail of the host down at once: only the mgmt fallback rail is left
  drain      operator drain through the r2cc control plane: POST /rails/<k>/drain to the
             control agent of the host's rank (address and token from its status file),
             undrain at restore; the link itself stays healthy

Used as a context manager so the rail is restored whatever happens to the load:

    with FaultInjector(lab, FaultSpec("down", host=0, rail=1, after_s=3, hold_s=5)) as fi:
        result = run_load(...)
    fi.record  # injected_at / restored_at (time.time()) and any error
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field

from r2cc_serve.errors import UserError
from r2cc_serve.serving import control

KINDS = ("down", "blackhole", "flap", "all-down", "drain")


@dataclass
class FaultSpec:
    kind: str = "down"
    host: int = 0
    rail: int = 1
    after_s: float = 3.0
    hold_s: float = 5.0
    flap_period_ms: int = 400
    flap_count: int = 8

    def check(self, lab) -> "FaultSpec":
        if self.kind not in KINDS:
            raise UserError(f"fault kind {self.kind!r} is not known: use one of {', '.join(KINDS)}")
        if not 0 <= self.host < lab.hosts or not 0 <= self.rail < lab.rails:
            raise UserError(f"fault target h{self.host} rail{self.rail} is outside the lab "
                            f"({lab.hosts} hosts x {lab.rails} rails)")
        return self

    def target_rails(self, lab_rails: int) -> list[int]:
        return list(range(lab_rails)) if self.kind == "all-down" else [self.rail]

    @property
    def text(self) -> str:
        where = f"h{self.host} all rails" if self.kind == "all-down" else f"h{self.host} rail{self.rail}"
        extra = f" {self.flap_period_ms}ms x{self.flap_count}" if self.kind == "flap" else ""
        return f"{self.kind}{extra} on {where} after {self.after_s:g} s for {self.hold_s:g} s"


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
        """status_dir: R2CC_STATUS_DIR of the deployment (needed by drain to find the agents).
        during: optional zero-argument probe called halfway through the hold (e.g. read health)."""
        self._during = during
        self.lab, self.spec = lab, spec.check(lab)
        self.status_dir = status_dir
        if spec.kind == "drain":
            control.agent_of_rank(status_dir, spec.host)  # fails now, not mid-load
        self.record = FaultRecord(spec)
        self._say = progress or (lambda m: print(f"[fault] {m}", file=sys.stderr, flush=True))
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, name="r2cc-serving-fault", daemon=True)
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
        s, lab = self.spec, self.lab
        self._injected = True
        self.record.inject_started_at = time.time()
        if s.kind == "drain":
            control.rail_action(self.status_dir, s.host, s.rail, "drain")
        elif s.kind == "flap":
            self._flap = lab.fault(s.host, s.rail, "flap", (s.flap_period_ms, s.flap_count), background=True)
        else:
            for rail in s.target_rails(self.lab.rails):
                lab.fault(s.host, rail, "blackhole" if s.kind == "blackhole" else "down")
        self.record.injected_at = time.time()
        self._say(f"injected {s.text}")

    def _restore(self) -> None:
        if not self._injected or self.record.restored_at is not None:
            return
        s = self.spec
        flap = getattr(self, "_flap", None)
        if flap is not None:  # let the flap finish (it ends with the link up), then clear
            flap.join(timeout=s.flap_period_ms * s.flap_count / 1000 + 10)
        for rail in s.target_rails(self.lab.rails):
            try:
                if s.kind == "drain":
                    control.rail_action(self.status_dir, s.host, rail, "undrain")
                else:
                    self.lab.fault(s.host, rail, "clear")
            except Exception as exc:
                self.record.errors.append(f"restore rail{rail}: {type(exc).__name__}: {exc}")
        self.record.restored_at = time.time()
        self._say(f"restored h{s.host} {'all rails' if s.kind == 'all-down' else f'rail{s.rail}'}")
