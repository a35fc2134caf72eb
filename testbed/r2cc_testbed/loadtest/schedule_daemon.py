"""The fault daemon: one long-lived real-time process that applies a round's fault schedule on time.

Why a process of its own: under serving load `r2cc lab fault` took 7-10 s (a new Python
process and `ip`/`nft` children at nice 0, waiting for a CPU). This one is started once per
deployment, runs SCHED_FIFO (nice -20 without the privilege), keeps its namespace sockets and
nftables contexts open (faults/inprocess_executor.py) and sleeps until each step is due
(faults/schedule.py), so a step costs microseconds (link flags, nft) to a millisecond (rate
changes through a tc batch process started with it) or an admin REST call. A thread in the
runner would not do: it would wait for the GIL behind threads that wait for a CPU.

Protocol, JSON lines: stdin gets the config line, then {"op": "play", "t0": MONOTONIC,
"entries": [{"at", "do"}]}, {"op": "abort"} or {"op": "quit"}; stdout answers
{"event": "ready"}, one {"event": "step", ...} per step as it is done, {"event": "finished"}.
Times are time.monotonic() (one clock system-wide) plus time.time() for matching r2cc events.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import math
import os
import sys
import time
import urllib.parse
from dataclasses import asdict
from typing import Callable

from r2cc_testbed.faults.inprocess_executor import InProcessExecutor, LineReader
from r2cc_testbed.faults.model import ADMIN_ACTIONS, parse_fault_text
from r2cc_testbed.faults.schedule import Step, expand, play
from r2cc_testbed.lab.layout import Layout

RT_PRIORITY = 50
ADMIN_TIMEOUT_S = 10.0
OBSERVE_S = 0.5  # longest watch for the kernel's link state after a step


class Actor:
    """Carries out steps: lab faults through the in-process executor, admin actions through the admin API."""

    def __init__(self, cfg: dict):
        self.layout = Layout(cfg["prefix"], cfg["hosts"], cfg["rails"])
        self.admin_url, self.token = cfg.get("admin_url"), cfg.get("token")
        self.host_labels = {int(k): v for k, v in (cfg.get("host_labels") or {}).items()}
        self.executor = InProcessExecutor(self.layout, cfg.get("rate"), cfg.get("mtu"))

    def do(self, step: Step) -> tuple[Callable[[], bool] | None, str]:
        """Apply step. Returns (a check that the kernel shows the new state, or None; detail)."""
        if step.kind in ADMIN_ACTIONS:
            return None, self._admin(step)
        return self.executor.apply(step.fault()), _detail(step)

    def _admin(self, step: Step) -> str:
        if not self.admin_url or not self.token:
            raise RuntimeError("no admin URL or token: admin actions need the r2cc backend")
        label = self.host_labels.get(step.host)
        if label is None:
            raise RuntimeError(f"host {step.host} has no name in the admin API (known: {self.host_labels})")
        url = urllib.parse.urlsplit(self.admin_url)
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=ADMIN_TIMEOUT_S)
        try:
            conn.request("POST", f"/r2cc/v1/rails/{label}/{step.rail}/{step.kind}",
                         headers={"Authorization": f"Bearer {self.token}", "Content-Length": "0"})
            resp = conn.getresponse()
            body = resp.read().decode(errors="replace")
        finally:
            conn.close()
        if resp.status != 200:
            raise RuntimeError(f"POST {step.kind} answered HTTP {resp.status}: {body[:200]}")
        return f"state {json.loads(body).get('state')}"


def _detail(step: Step) -> str:
    """What a step's record says besides its label: a rate change's rate, a share of packets dropped."""
    if step.kind == "degrade":
        return f"tc rate {step.rate}"
    return "" if step.loss_pct is None else f"{step.loss_pct:g}% loss"


def raise_priority() -> str:
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))
        return f"SCHED_FIFO {RT_PRIORITY}"
    except (PermissionError, OSError):
        try:
            os.setpriority(os.PRIO_PROCESS, 0, -20)
            return "nice -20 (no real-time privilege)"
        except PermissionError:
            return "nice 0 (no privilege to raise it: faults may land late under load)"


def _emit(doc: dict) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def play_round(actor: Actor, lines: LineReader, t0: float, steps: list[Step]) -> str:
    """Apply steps at t0 + at_s, each reported as it is done; returns "finished", "aborted" or "quit"."""

    def do(n: int, step: Step) -> None:
        started = time.monotonic()
        record = {"event": "step", **asdict(step), "due": t0 + step.at_s, "started": started}
        try:
            check, detail = actor.do(step)
            record.update(detail=detail, error=None)
        except Exception as exc:  # reported with the round; the schedule goes on
            check = None
            record.update(detail="", error=f"{type(exc).__name__}: {exc}")
        record["done"] = time.monotonic()
        record["wall_done"] = time.time()
        # Watch for the kernel's view only until the next step is due: it must never delay one.
        next_due = t0 + steps[n + 1].at_s if n + 1 < len(steps) else math.inf
        record["observed"] = _observe(check, min(next_due - 0.001, record["done"] + OBSERVE_S)) if check else None
        _emit(record)

    return play(steps, t0, do, lambda due: _wait_until(lines, due))


def _wait_until(lines: LineReader, due: float) -> str | None:
    """Sleep until due while listening for abort/quit (returned as "aborted"/"quit")."""
    while (wait := due - time.monotonic()) > 0:
        cmd = lines.next(wait)
        if lines.eof:
            return "quit"
        op = json.loads(cmd).get("op") if cmd else None
        if op in ("abort", "quit"):
            return "aborted" if op == "abort" else "quit"
    return None


def _observe(check: Callable[[], bool], until: float) -> float | None:
    """time.monotonic() when check() first held (None: not before `until`)."""
    while True:
        now = time.monotonic()
        try:
            if check():
                return now
        except OSError:
            return None
        if now >= until:
            return None
        time.sleep(0.0005)


def main() -> int:
    lines = LineReader(sys.stdin.fileno())
    cfg = json.loads(lines.next(None) or "{}")
    priority = raise_priority()
    actor = Actor(cfg)
    _emit({"event": "ready", "priority": priority, "pid": os.getpid()})
    while True:
        line = lines.next(None)
        if line is None:
            return 0  # stdin closed: the runner is gone
        cmd = json.loads(line)
        if cmd.get("op") == "quit":
            return 0
        if cmd.get("op") == "play":
            entries = [dataclasses.replace(parse_fault_text(e["do"]), after_s=float(e["at"])) for e in cmd["entries"]]
            outcome = play_round(actor, lines, float(cmd["t0"]), expand(entries))
            _emit({"event": "finished", "outcome": outcome, "at": time.monotonic()})
            if outcome == "quit":
                return 0


if __name__ == "__main__":
    sys.exit(main())
