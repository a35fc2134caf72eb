"""Rail health as operators see it: sampled state, transitions as events, a status file.

A `RailMonitor` samples one communicator's per-connection stats, turns state changes
into events (also logged), summarises health (ok / degraded / down) and keeps
`<status_dir>/<group>-rank<r>.json` current for tools on the same host. It also holds the
operator's decisions for this group on this host (health/decisions.py) and shows each rail's.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import os
import threading
import time

from r2cc_serve.health import loglines
from r2cc_serve.health.decisions import DecisionStore, describe
from r2cc_serve.health.liveness import process_identity
from r2cc_serve import envs
from r2cc_serve.util.priority import raise_thread_priority

# Samples of this process, numbered across all its monitors: a reader tells a newer sample from an
# older one without the clock, also when a group is rebuilt in the same process (vLLM's fault
# tolerance re-initialises its groups: a new monitor must not start again below the old one's).
_SAMPLE_SEQ = itertools.count(1)

log = logging.getLogger("r2cc_serve.health")

MAX_EVENTS = 256
# A reader that needs every rank's counters as of now (byte totals after a load) touches this
# file in the status directory: each monitor rewrites its file at its next sample.
REFRESH_REQUEST = ".refresh"
SPIN_COUNTERS = ("spin_hits", "spin_misses", "spin_skips", "spin_briefs")  # counters(): how waits went (R2CC_SPIN_US)


def spin_waits(snapshots) -> dict:
    """The spin counters of status snapshots (ranks, or a rank's groups) summed, and the highest
    CPU pressure their spin gates last saw; {} when none carries them (agents of older builds)."""
    out: dict = {}
    for snap in snapshots:
        c = snap.get("counters") or {}
        if "spin_skips" not in c:
            continue
        for k in SPIN_COUNTERS:
            out[k] = out.get(k, 0) + int(c.get(k, 0))  # spin_briefs: not in agents of older builds
        out["cpu_pressure"] = max(out.get("cpu_pressure", 0.0), float(c.get("cpu_pressure", 0.0)))
    return out


def summarize(rails: list[dict], error: str, peers: list[dict] = ()) -> tuple[str, list[str]]:
    """(status, reasons): down if the group is aborted, degraded if any rail is not fully usable
    or a peer's process is stalled."""
    if error:
        return "down", [error.splitlines()[0]]
    reasons = []
    for p in peers:
        if p["stalled"]:
            reasons.append(f"rank {p['peer']} is stalled: its process sent nothing for {p['stalled_for_s']:.1f} s "
                           "while its host kept acknowledging (the network is fine; rails stay up)")
    for r in rails:
        if not r.get("fallback") and r["state"] != "up":
            why = "; ".join(describe(r["rail"], d["action"], d) for d in r.get("decisions", ()))
            why = why or (r["last_error"] if r["last_error"] and r["state"] == "down" else "")
            why = why or (r.get("hold_reason", "") if r["state"] == "held" else "")
            reasons.append(f"rail{r['rail']} to rank {r['peer']} is {r['state']}" + (f" ({why})" if why else ""))
    primaries_down = {r["peer"] for r in rails if not r.get("fallback")} - {
        r["peer"] for r in rails if not r.get("fallback") and r["state"] in ("up", "held", "draining", "drained")}
    for peer in sorted(primaries_down):
        reasons.append(f"every rail to rank {peer} is down: traffic runs on the fallback rail")
    return ("degraded" if reasons else "ok"), reasons


def _state_key(snap: dict) -> tuple:
    """What readers of a status file act on at once (agent address, rail and peer states, events,
    errors); counters, byte totals and durations may lag by R2CC_STATUS_REFRESH_MS."""
    events = snap["events"]
    return (snap["status"], tuple(snap["reasons"]), snap["error"], len(events), events[-1]["time"] if events else 0,
            tuple((r["peer"], r["rail"], r["state"], r.get("hold_reason", ""), r["last_error"],
                   json.dumps(r.get("decisions", []), sort_keys=True)) for r in snap["rails"]),
            tuple((p["peer"], p["stalled"]) for p in snap["peers"]),
            snap.get("agent_address"), snap.get("agent_token"))


def _usable_status_dir(status_dir: str, group: str, rank: int) -> bool:
    """Makes the status directory (owner only: the files hold agent tokens, also for an old
    directory). One that cannot be made costs the file, not the rank: logged, False."""
    try:
        os.makedirs(status_dir, mode=0o700, exist_ok=True)
        if os.stat(status_dir).st_uid == os.getuid():
            os.chmod(status_dir, 0o700)
        return True
    except OSError as exc:
        log.error("r2cc: cannot use R2CC_STATUS_DIR=%s (%s); %s rank %d writes no status file, so `r2cc admin` "
                  "on this host will not see it. Make the directory writable or point R2CC_STATUS_DIR elsewhere",
                  status_dir, exc.strerror or exc, group, rank)
        return False


class RailMonitor:
    def __init__(self, comm, group: str, rank: int, node: int, status_dir: str | None, interval_s: float,
                 host: str, extra: dict | None = None, state_dir: str | None = None):
        """state_dir: where operator decisions are kept (None: R2CC_STATE_DIR; "": in memory only)."""
        self.comm, self.group, self.rank, self.node, self.host = comm, group, rank, node, host
        self.interval_s = interval_s
        self.refresh_s = envs.get("R2CC_STATUS_REFRESH_MS") / 1000.0
        # The file's last write: its state key, monotonic time, and wall clock when it began
        # (REFRESH_REQUEST's mtime is compared against that).
        self._written: tuple = (None, 0.0, 0)
        # What the last full sample saw (state_signature, decisions' version) and when it was taken.
        self._sampled: tuple = (None, 0.0)
        self.extra = dict(extra or {})  # e.g. the control agent's address and token
        self.events: collections.deque = collections.deque(maxlen=MAX_EVENTS)
        self._last: dict[tuple[int, int], str] = {}
        self._stalled: dict[int, bool] = {}
        self.identity = process_identity()  # lets readers of the status file tell a dead rank's leftover
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sample_lock = threading.Lock()  # the thread and operator actions both sample
        self.status_path = None
        self._asked_path = ""  # REFRESH_REQUEST beside the status file (none without one)
        self.decisions = DecisionStore(envs.get("R2CC_STATE_DIR") if state_dir is None else state_dir, group, host)
        if status_dir and not _usable_status_dir(status_dir, group, rank):
            status_dir = None
        if status_dir:
            safe = group.replace("/", "_").replace(":", "_")
            self.status_path = os.path.join(status_dir, f"{safe}-rank{rank}.json")
            self._asked_path = os.path.join(status_dir, REFRESH_REQUEST)
        self._snapshot = self._sample()
        self._thread = threading.Thread(target=self._run, name=f"r2cc-monitor-{group}", daemon=True)

    def start(self) -> "RailMonitor":
        try:
            self.refresh_now()  # the status file at once, with what the agent applied at its start
        except Exception as exc:  # as in _run: the monitor must never take the worker down
            log.debug("r2cc monitor sample failed: %s", exc)
        self._thread.start()
        return self

    def snapshot(self) -> dict:
        with self._lock:
            return self._snapshot

    def _sample(self) -> dict:
        rails = self.comm.rail_stats()
        decided = self.decisions.by_rail()
        for r in rails:
            r["decisions"] = [{"action": kind, **d} for kind, d in decided.get(r["rail"], {}).items()]
        error = self.comm.error()
        now = time.time()
        changed = []
        for r in rails:
            key = (r["peer"], r["rail"])
            prev = self._last.get(key)
            if prev is not None and prev != r["state"]:
                ev = {"time": now, "group": self.group, "rank": self.rank, "node": self.node, "host": self.host,
                      "peer": r["peer"],
                      "rail": r["rail"], "address": r["address"], "from": prev, "to": r["state"],
                      "error": r["last_error"] if r["state"] == "down" else r["hold_reason"] if r["state"] == "held" else "",
                      "detect_s": r["last_detect_s"] if r["state"] == "down" else None}
                self.events.append(ev)
                changed.append(ev)
            self._last[key] = r["state"]
        # Sampled after the rails: a goodbye marks the peer closed as it takes its rails down.
        peers = self.comm.peer_stats()
        closed = {p["peer"] for p in peers if p["closed"]}
        for ev in changed:
            # A peer that closed its communicator took its rails down on purpose: not a warning.
            level = logging.INFO if ev["peer"] in closed and ev["to"] == "down" else logging.WARNING
            log.log(level, "%s", loglines.transition_line(self.group, self.rank, ev["rail"], ev["peer"], ev["from"],
                                                          ev["to"], ev["error"]))
        for p in peers:
            if self._stalled.get(p["peer"], False) != p["stalled"]:
                self._peer_event(now, p)
            self._stalled[p["peer"]] = p["stalled"]
        status, reasons = summarize(rails, error, peers)
        return {"time": now, "seq": next(_SAMPLE_SEQ), "group": self.group, "rank": self.rank, "node": self.node,
                "host": self.host, "status": status, "durations": self.comm.duration_histogram(),
                "reasons": reasons, "error": error, "error_kind": self.comm.error_kind(), "rails": rails,
                "peers": peers, "counters": self.comm.counters(), "events": list(self.events),
                "plan": self.comm.plan_info(),
                "process": self.identity, **self.extra}

    def _peer_event(self, now: float, p: dict) -> None:
        """A peer's process stalled (silent, its host still acknowledging) or resumed."""
        to = "stalled" if p["stalled"] else "running"
        took = None if p["stalled"] else p["last_stall_s"]
        ev = {"time": now, "kind": "peer", "group": self.group, "rank": self.rank, "node": self.node,
              "host": self.host, "peer": p["peer"], "rail": None, "address": None,
              "from": "running" if p["stalled"] else "stalled", "to": to,
              "error": "" if not p["stalled"] else "its process sends nothing; its host acknowledges (not a network fault)",
              "detect_s": took}
        self.events.append(ev)
        log.warning("r2cc: %s rank %d: rank %d %s%s", self.group, self.rank, p["peer"],
                    "stalled (its process is silent, its host acknowledges: rails stay up)" if p["stalled"]
                    else "resumed", f" after {took:.1f} s" if took else "")

    def _write(self, snap: dict, key: tuple | None = None) -> None:
        if not self.status_path:
            return
        # One write of the whole text: json.dump into a file object wrote it in hundreds of small
        # pieces, about 1 ms of CPU per sample at nice -10, taken from a rank's collectives.
        started_ns = time.time_ns()
        data = json.dumps(snap).encode()
        tmp = f"{self.status_path}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # holds the agent token
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, self.status_path)
        self._written = (_state_key(snap) if key is None else key, time.monotonic(), started_ns)

    def _write_if_due(self, snap: dict) -> None:
        """The periodic sample's write: at once when anything a reader acts on changed (states,
        events, errors, decisions) or a reader asked (REFRESH_REQUEST), else once per
        R2CC_STATUS_REFRESH_MS (counters, byte totals):
        rewriting the file every 100 ms cost each rank ~1% of a core and, in its collectives, the
        slowest 1% of calls (4-64 KiB all_reduce p99 2.3-2.7x Open MPI's with it, 1.3-1.9x without)."""
        written_key, at, _ = self._written
        key = _state_key(snap)
        if key != written_key or time.monotonic() - at >= self.refresh_s or self._refresh_requested():
            self._write(snap, key)

    def _signature(self) -> tuple:
        return self.comm.state_signature(), self.decisions.version

    def _sample_due(self, current: tuple) -> bool:
        """A full sample only when a state, error or decision changed (`current`: the signature
        now), a reader asked, or R2CC_STATUS_REFRESH_MS passed (counters): one every interval cost
        each rank 0.15-0.5 ms of CPU ten times a second, at nice -10, so each one preempted a
        spinning caller (in traces of 4 KiB all_reduces every such call was among the slowest 1%)."""
        signature, at = self._sampled
        return current != signature or time.monotonic() - at >= self.refresh_s or self._refresh_requested()

    def _refresh_requested(self) -> bool:
        if not self._asked_path:
            return False
        try:
            asked_ns = os.stat(self._asked_path).st_mtime_ns
        except OSError:
            return False
        return asked_ns >= self._written[2]

    def refresh_now(self) -> dict:
        """Sample at once (after an operator action, so its outcome is visible immediately)."""
        return self._refresh(self._write)

    def _refresh(self, write) -> dict:
        with self._sample_lock:
            # Read before the sample: a change while it runs shows at the next check.
            self._sampled = (self._signature(), time.monotonic())
            snap = self._sample()
            with self._lock:
                self._snapshot = snap
        write(snap)
        return snap

    def _run(self) -> None:
        # Operator actions wait on _sample_lock, which this thread holds while it samples.
        raise_thread_priority(envs.get("R2CC_CONTROL_NICE"))  # the agent logs it when not allowed
        while not self._stop.is_set():
            try:
                started = time.monotonic()
                current = self._wait_for_change()
                if self._stop.is_set():
                    break
                if self._sample_due(current):
                    self._refresh(self._write_if_due)
                elif time.monotonic() - started < self.interval_s / 2:
                    self._stop.wait(self.interval_s)  # back early for nothing (a closed transport)
            except Exception as exc:  # the monitor must never take the worker down
                log.debug("r2cc monitor sample failed: %s", exc)
                self._stop.wait(self.interval_s)

    def _wait_for_change(self) -> tuple:
        """Until a full sample may be due: the state signature moved, a reader asked (.refresh)
        or R2CC_STATUS_REFRESH_MS is up; the signature then (the last sample's if the refresh is
        due). The transport's watchdog passes look every interval, on a thread that runs anyway,
        and wake this one only for a change: the same check in Python took the GIL from the
        rank's caller ten times a second, and in this thread (raised priority) it took the core.
        Operator actions sample at once themselves (refresh_now), decisions included."""
        signature, at = self._sampled
        left = self.refresh_s - (time.monotonic() - at)
        if left <= 0:
            return signature
        now = self.comm.wait_state_change(signature[0], self.interval_s, left, self._asked_path, self._written[2])
        return now, self.decisions.version

    def stop(self) -> None:
        self._stop.set()
        try:
            self.comm.interrupt_state_wait()
        except Exception as exc:  # a transport already gone: its wait has returned
            log.debug("r2cc monitor: interrupting its wait failed: %s", exc)
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        if self.status_path:
            try:
                os.unlink(self.status_path)
            except FileNotFoundError:
                pass
