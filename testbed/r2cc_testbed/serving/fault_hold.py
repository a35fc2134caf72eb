"""Hold one fault of r2cc_testbed.faults.model while a load runs: wait after_s, inject, hold hold_s, undo.

Lab kinds (down, blackhole, degrade, flap, all-down) change the lab and are cleared at the end.
Admin actions (drain, failover) go to the r2cc control agent of the host's rank (address and
token from its status file) and are undone by undrain / restore; the link itself stays healthy.

Used as a context manager so the rail is restored whatever happens to the load:

    with FaultInjector(lab, FaultSpec("down", host=0, rail=1, after_s=3, hold_s=5)) as fi:
        result = run_load(...)
    fi.record  # injected_at / restored_at (time.time()) and any error

(FaultSpec is importable from here too: tests/e2e do.)
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from dataclasses import dataclass, field

from r2cc_serve.errors import UserError
from r2cc_testbed.faults.model import HELD_KINDS, FaultSpec, labelled, parse_fault_words
from r2cc_testbed.faults.schedule import HeldFaults
from r2cc_testbed.serving import control


def parse_option(text: str, host: int, rail: int, after_s: float, hold_s: float) -> FaultSpec:
    """`--fault KIND[:ARGS]` of the demo and serve-bench: down, flap:200:5, degrade:100mbit, drain..."""
    with labelled(f"--fault {text!r}"):
        spec = parse_fault_words(text.strip().split(":"), host, rail, HELD_KINDS)
        return dataclasses.replace(spec, after_s=after_s, hold_s=hold_s)


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
