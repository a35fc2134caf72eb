"""The fault daemon: one long-lived real-time process that applies a round's fault schedule on time.

Why a process of its own: under serving load `r2cc lab fault` took 7-10 s (a new Python
process and `ip`/`nft` children at nice 0, waiting for a CPU). This one is started once per
deployment, runs SCHED_FIFO (nice -20 without the privilege), keeps its namespace sockets and
nftables contexts open (linkops.py) and sleeps until each step is due, so a step costs
microseconds (link flags, nft) to a millisecond (rate changes through a tc batch process
started with it) or an admin REST call. A thread in the
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
from dataclasses import asdict, dataclass
from typing import Callable

from r2cc_testbed.faults.model import FaultSpec, parse_fault_text
from r2cc_testbed.lab.layout import Layout
from r2cc_testbed.lab.nft_rules import NFT_FAULTS, clear_scripts, fault_scripts
from r2cc_testbed.loadtest.linkops import LineReader, LinkSwitch, NftInNamespaces, TcSessions

RT_PRIORITY = 50
ADMIN_TIMEOUT_S = 10.0
OBSERVE_S = 0.5  # longest watch for the kernel's link state after a step


@dataclass
class Step:
    """One kernel change or admin call at one moment: a flap is 2 x count steps."""
    entry: int          # index in the schedule
    at_s: float         # seconds after t0 it is due
    kind: str           # down, up, blackhole, clear, degrade, lossy, gray, marginal, all-down, drain, ...
    host: int
    rail: int | None
    rate: str | None = None
    loss_pct: float | None = None
    direction: str | None = None  # gray, marginal
    max_bytes: int | None = None  # gray, marginal
    label: str = ""     # what a person reads: "down h0 rail1", "flap 2/50 up h0 rail1"


def expand(entries: list[FaultSpec]) -> list[Step]:
    """Steps of a schedule in time order (pure)."""
    steps = []
    for n, spec in enumerate(entries):
        target = spec.target
        if spec.kind == "flap":
            half = spec.period_ms / 2000.0
            for i in range(spec.count):
                base = spec.after_s + i * spec.period_ms / 1000.0
                steps.append(Step(n, base, "down", spec.host, spec.rail, label=f"flap {i + 1}/{spec.count} down {target}"))
                steps.append(Step(n, base + half, "up", spec.host, spec.rail, label=f"flap {i + 1}/{spec.count} up {target}"))
        else:
            steps.append(Step(n, spec.after_s, spec.kind, spec.host, spec.rail, spec.rate, spec.loss_pct,
                              spec.direction, spec.max_bytes, f"{spec.action} {target}"))
    return sorted(steps, key=lambda s: (s.at_s, s.entry))


class Actor:
    """Carries out steps on the lab and the admin API."""

    def __init__(self, cfg: dict):
        self.layout = Layout(cfg["prefix"], cfg["hosts"], cfg["rails"])
        self.rate, self.mtu = cfg.get("rate"), cfg.get("mtu")
        self.admin_url, self.token = cfg.get("admin_url"), cfg.get("token")
        self.host_labels = {int(k): v for k, v in (cfg.get("host_labels") or {}).items()}
        hosts = [self.layout.host_ns(i) for i in range(self.layout.hosts)]
        namespaces = hosts + ([self.layout.switch_ns] if self.layout.switched else [])
        self.links = LinkSwitch(namespaces)
        self.nft = NftInNamespaces(namespaces)  # a lossy or gray rail's far end may be the switch
        self.tc = TcSessions(namespaces)
        self.degraded: set[tuple[int, int]] = set()

    def do(self, step: Step) -> tuple[Callable[[], bool] | None, str]:
        """Apply step. Returns (a check that the kernel shows the new state, or None; detail)."""
        if step.kind in ("drain", "undrain", "failover", "restore"):
            return None, self._admin(step)
        if step.kind == "all-down":
            checks = [self._link(step.host, k, up=False) for k in range(self.layout.rails)]
            return (lambda: all(c() for c in checks)), ""
        if step.kind in ("down", "up"):
            return self._link(step.host, step.rail, up=step.kind == "up"), ""
        if step.kind in NFT_FAULTS:
            for ns, script in fault_scripts(self.layout, step, self.mtu):
                self.nft.run(ns, script)
            return None, "" if step.loss_pct is None else f"{step.loss_pct:g}% loss"
        if step.kind == "degrade":
            self._shape(step.host, step.rail, step.rate)
            self.degraded.add((step.host, step.rail))
            return None, f"tc rate {step.rate}"
        if step.kind == "clear":
            return self._clear(step.host, step.rail), ""
        raise ValueError(f"unknown step kind {step.kind}")

    def _link(self, host: int, rail: int, up: bool) -> Callable[[], bool]:
        """Set host's end of rail down/up; the check: the link state (operstate) the kernel shows.

        Down: the peer's end has lost its carrier. Up: our end has a carrier again. The kernel
        updates that state from a worker thread (linkwatch), so it may lag the change itself.
        """
        (ns, dev), (peer_ns, peer_dev) = self.layout.link_ends(host, rail)
        self.links.set_up(ns, dev, up)
        if up:
            return lambda: self.links.carrier(ns, dev)
        return lambda: not self.links.carrier(peer_ns, peer_dev)

    def _clear(self, host: int, rail: int | None) -> Callable[[], bool]:
        checks = []
        for k in (range(self.layout.rails) if rail is None else [rail]):
            for ns, script in clear_scripts(self.layout, host, k):
                self.nft.run(ns, script)
            checks.append(self._link(host, k, up=True))
            if (host, k) in self.degraded:
                self._shape(host, k, self.rate)
                self.degraded.discard((host, k))
        return lambda: all(c() for c in checks)

    def _shape(self, host: int, rail: int, rate: str | None) -> None:
        self.tc.set_rate(self.layout, host, rail, rate)

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


def play(actor: Actor, lines: LineReader, t0: float, steps: list[Step]) -> str:
    """Apply steps at t0 + at_s; returns "finished", "aborted" or "quit"."""
    for n, step in enumerate(steps):
        due = t0 + step.at_s
        if (stop := _wait_until(lines, due)) is not None:
            return stop
        started = time.monotonic()
        record = {"event": "step", **asdict(step), "due": due, "started": started}
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
    return "finished"


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
            outcome = play(actor, lines, float(cmd["t0"]), expand(entries))
            _emit({"event": "finished", "outcome": outcome, "at": time.monotonic()})
            if outcome == "quit":
                return 0


if __name__ == "__main__":
    sys.exit(main())
