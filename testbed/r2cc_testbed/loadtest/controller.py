"""The runner's handle on the fault daemon (schedule_daemon.py): start it once, play schedules, stop it.

    with FaultController(lab, admin_url=dep.url, token=token, host_labels={0: "node0", 1: "node1"}) as ctl:
        ctl.play(t0, scenario.schedule)      # returns at once; the daemon keeps time
        ...
        steps = ctl.wait(timeout_s=60)       # one record per step: due, started, done, observed, error
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time

from r2cc_serve.errors import UserError
from r2cc_testbed.faults.model import FaultSchedule
from r2cc_testbed import child_pythonpath

READY_TIMEOUT_S = 60.0  # imports and namespace sockets; a loaded 2-core box may take a while


class FaultController:
    def __init__(self, lab, *, admin_url: str | None = None, token: str | None = None,
                 host_labels: dict[int, str] | None = None, log_path: str | None = None):
        self._cfg = {"prefix": lab.prefix, "hosts": lab.hosts, "rails": lab.rails, "rate": lab.rate, "mtu": lab.mtu,
                     "admin_url": admin_url, "token": token, "host_labels": host_labels or {}}
        self._log_path = log_path or os.devnull
        self._proc: subprocess.Popen | None = None
        self._events: queue.Queue = queue.Queue()
        self.priority = ""

    def __enter__(self) -> "FaultController":
        env = dict(os.environ, PYTHONPATH=child_pythonpath(os.environ.get("PYTHONPATH")))
        self._log = open(self._log_path, "ab")
        self._proc = subprocess.Popen([sys.executable, "-m", "r2cc_testbed.loadtest.schedule_daemon"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                      env=env, start_new_session=True)
        threading.Thread(target=self._read, name="r2cc-loadtest-faultd", daemon=True).start()
        self._send(self._cfg)
        ready = self._next(READY_TIMEOUT_S)
        if ready is None or ready.get("event") != "ready":
            self.__exit__(None, None, None)
            raise UserError(f"the fault daemon did not start within {READY_TIMEOUT_S:.0f} s "
                            f"(see {self._log_path}): {ready}")
        self.priority = ready["priority"]
        return self

    def play(self, t0: float, schedule: FaultSchedule) -> None:
        """Apply schedule's entries at t0 + at (t0 in time.monotonic()); returns at once."""
        self._drain()
        self._send({"op": "play", "t0": t0, "entries": schedule.to_list()})

    def wait(self, timeout_s: float) -> tuple[list[dict], str]:
        """Step records until the schedule finished, and how it ended ("finished", "aborted", "timeout")."""
        deadline = time.monotonic() + timeout_s
        steps = []
        while True:
            ev = self._next(max(0.0, deadline - time.monotonic()))
            if ev is None:
                return steps, "timeout" if self.alive() else "daemon exited"
            if ev.get("event") == "step":
                steps.append(ev)
            elif ev.get("event") == "finished":
                return steps, ev["outcome"]

    def abort(self) -> None:
        """Stop a schedule that is playing (steps already done stay done)."""
        self._send({"op": "abort"})

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __exit__(self, *exc) -> None:
        if self._proc is None:
            return
        self._send({"op": "quit"})
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=5)
        self._log.close()
        self._proc = None

    def _send(self, doc: dict) -> None:
        try:
            self._proc.stdin.write((json.dumps(doc) + "\n").encode())
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError, AttributeError):
            pass  # the daemon is gone; wait() reports it

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                self._events.put(json.loads(line))
            except ValueError:
                continue

    def _next(self, timeout_s: float) -> dict | None:
        try:
            return self._events.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def _drain(self) -> None:
        while not self._events.empty():
            self._events.get_nowait()
