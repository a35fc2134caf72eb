"""What the r2cc workers say about their rails: proof that a failover happened, and when.

Two sources, used together:
- Log lines. Every rail state change is logged by the C++ core as
  `r2cc: <group> rank R railK to rank P: <old> -> <new> (<reason>)`. The lines carry no
  time stamp, so LogWatcher tails the vLLM logs every 50 ms and stamps each new line with
  the time it was first seen (good to ~0.1 s, enough for detect/recover times).
- Status files: each r2cc worker writes `$R2CC_STATUS_DIR/<group>-rank<r>.json` with per
  (peer, rail) `rails` (state, failovers, chunks_resent, bytes_resent, bytes_sent,
  last_error, fallback), `counters` and `events`. Read when present; the log works without.
"""

from __future__ import annotations

import glob
import json
import os
import threading
import time
from dataclasses import dataclass

from r2cc_serve.health import loglines
from r2cc_serve.health.monitor import REFRESH_REQUEST



@dataclass(frozen=True)
class Transition:
    seen_at: float   # time.time() when the line was first read
    source: str      # log file name
    group: str
    rank: int
    rail: int
    peer: int
    old: str
    new: str
    reason: str
    detect_s: float | None = None  # status events: how long the core took to call the rail dead


class LogWatcher:
    """Tails log files in a thread; collects r2cc rail transitions with a time stamp."""

    def __init__(self, paths: list[str], interval_s: float = 0.05):
        self.paths = list(paths)
        self.interval_s = interval_s
        self.transitions: list[Transition] = []
        self.lines_seen = 0
        self._offsets = {p: _size(p) for p in self.paths}  # only what happens from now on
        self._partial = {p: "" for p in self.paths}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="r2cc-log-watcher", daemon=True)

    def __enter__(self) -> "LogWatcher":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._poll()  # lines written just before the stop

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._poll()

    def _poll(self) -> None:
        now = time.time()
        for path in self.paths:
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets[path])
                    data = f.read()
            except OSError:
                continue
            if not data:
                continue
            self._offsets[path] += len(data)
            text = self._partial[path] + data.decode(errors="replace")
            *lines, self._partial[path] = text.split("\n")
            found = [t for t in (_parse(line, now, os.path.basename(path)) for line in lines) if t]
            with self._lock:
                self.lines_seen += len(lines)
                self.transitions.extend(found)

    def between(self, start: float | None = None, end: float | None = None) -> list[Transition]:
        with self._lock:
            return [t for t in self.transitions
                    if (start is None or t.seen_at >= start) and (end is None or t.seen_at <= end)]


def _parse(line: str, now: float, source: str) -> Transition | None:
    f = loglines.parse_transition(line)
    return None if f is None else Transition(now, source, **f)


def read_status_now(status_dir: str, timeout_s: float = 2.0) -> dict[str, dict]:
    """read_status once every rank has rewritten its file since this call (the monitors refresh
    counters only once a second unless asked, and byte totals after a load must be the load's):
    asks through the refresh file, waits up to timeout_s (a rank that does not answer, e.g. a
    dead one's leftover, is read as it is)."""
    request = os.path.join(status_dir, REFRESH_REQUEST)
    try:
        with open(request, "w"):
            pass
        asked_ns = os.stat(request).st_mtime_ns
    except OSError:
        return read_status(status_dir)  # no directory yet: nothing to refresh
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        paths = glob.glob(os.path.join(status_dir, "*.json"))
        try:
            if all(os.stat(p).st_mtime_ns >= asked_ns for p in paths):
                break
        except OSError:
            pass  # a file being replaced: look again
        time.sleep(0.02)
    return read_status(status_dir)


def read_status(status_dir: str) -> dict[str, dict]:
    """{file name: parsed JSON} of every worker status file (empty if none written yet)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(status_dir, "*.json"))):
        try:
            with open(path) as f:
                out[os.path.basename(path)] = json.load(f)
        except (OSError, ValueError):
            continue  # being rewritten right now; the next read gets it
    return out


def status_transitions(status: dict[str, dict]) -> list[Transition]:
    """Rail events of every status file as Transitions (seen_at = the monitor's sample time)."""
    out = []
    for name, doc in status.items():
        for ev in doc.get("events") or []:
            try:
                out.append(Transition(float(ev["time"]), name, str(ev.get("group", "")), int(ev["rank"]),
                                      int(ev["rail"]), int(ev["peer"]), str(ev["from"]), str(ev["to"]),
                                      str(ev.get("error") or ""),
                                      None if ev.get("detect_s") is None else float(ev["detect_s"])))
            except (KeyError, TypeError, ValueError):
                continue  # an event shape we do not know: the log lines still count
    return sorted(out, key=lambda t: t.seen_at)


def rails_not_up(status: dict[str, dict], rails: list[int] | None = None) -> dict[str, str]:
    """{"rank R railK": why} for every status-file row (of `rails`, default all) not "up": its
    state, hold time left and reason, holds, loss holds, failures and last error (what an
    operator would look at first)."""
    return {f"rank{doc.get('rank')} rail{r.get('rail')}":
            f"{r.get('state')}, hold left {r.get('hold_left_s')} s ({r.get('hold_reason') or '-'}), "
            f"holds {r.get('holds')}, loss holds {r.get('loss_holds')}, failures {r.get('flap_failures')}, "
            f"last error {str(r.get('last_error') or '-')[:120]}"
            for doc in status.values() for r in doc.get("rails") or []
            if r.get("state") != "up" and (rails is None or int(r.get("rail", -1)) in rails)}


def rail_totals(status: dict[str, dict]) -> dict[int, dict]:
    """Per rail index, summed over workers and peers: bytes_sent, failovers, chunks/bytes_resent."""
    out: dict[int, dict] = {}
    for doc in status.values():
        for r in doc.get("rails") or []:
            t = out.setdefault(int(r.get("rail", -1)), {"bytes_sent": 0, "failovers": 0, "chunks_resent": 0,
                                                         "bytes_resent": 0, "fallback": bool(r.get("fallback"))})
            for k in ("bytes_sent", "failovers", "chunks_resent", "bytes_resent"):
                t[k] += int(r.get(k) or 0)
    return out


def rail_errors(status: dict[str, dict]) -> list[str]:
    """Each worker's rails with a last error, one line each: what a failed fault assertion shows."""
    return [f"rank {doc.get('rank')} rail {r.get('rail')}: {r['last_error']}"
            for doc in status.values() for r in doc.get("rails") or [] if r.get("last_error")]


def diff_totals(before: dict[int, dict], after: dict[int, dict]) -> dict[int, dict]:
    out = {}
    for rail, a in after.items():
        b = before.get(rail, {})
        out[rail] = {k: (v - b.get(k, 0) if isinstance(v, int) and not isinstance(v, bool) else v)
                     for k, v in a.items()}
    return out


def rail_map_from_logs(paths: list[str]) -> dict[int, str]:
    """{rail index: address} from the `group ... up on rails [...]` line (first rank found)."""
    for path in paths:
        try:
            with open(path, errors="replace") as f:
                for line in f:
                    ips = loglines.parse_group_up(line)
                    if ips is not None:
                        return dict(enumerate(ips))
        except OSError:
            continue
    return {}


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
