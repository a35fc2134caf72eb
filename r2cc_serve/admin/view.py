"""The operator's view of a group, kept fresh by a background thread.

A `GroupView` polls the control agent of every rank (kept-alive HTTP, short timeouts) every
R2CC_ADMIN_REFRESH_MS in a thread of its own and publishes an immutable `Snapshot` with the
JSON of the hot reads already encoded. A GET therefore never waits on a worker round trip and
adds almost nothing to the event loop it shares with vLLM's request handling. The numbers are
each rank monitor's last sample (counters up to R2CC_STATUS_REFRESH_MS old, more while a rank
is late and its last answer stands in): each rail says when (`sampled_at`) and whether (`stale`),
and a rank's numbers never go back to an older sample of the same process, nor vanish while it
is silent (then it is also reported unreachable).

Actions (drain, undrain, failover, restore) run one at a time in a worker thread: the
last-healthy-rail check on the poller's picture when every rank answered it in the last
ACTION_PICTURE_MAX_AGE_S (else on a fresh read of every rank), then one POST to the agents
of every rank on the named host, whose replies carry their state right after the action and
are folded into the picture at once. The picture may lag the truth, so each rank checks
again itself, in the same step as the action (409 from any rank: the others are undone). One round trip to busy workers, not three: each one
can wait for a worker's GIL. Then the poller samples fast for a moment so that the peers'
side of the change (they learn of it through the transport) shows up at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from r2cc_serve.admin.audit import AuditLog
from r2cc_serve.admin.snapshot import EMPTY, HEALTHY, STATE_ORDER, Snapshot  # noqa: F401 (STATE_ORDER re-exported)
from r2cc_serve.admin.sources import AgentRef

log = logging.getLogger("r2cc_serve.admin")

AGENT_TIMEOUT_S = 1.0     # one agent's answer to a read; a stuck rank must not stall the view
ACTION_TIMEOUT_S = 10.0   # one agent's answer to an action (it may wait for in-flight chunks)
AGENT_STALE_S = 5.0      # a rank that misses polls this long is reported unreachable (its last answer stays shown)
AGENTS_TIMEOUT_S = 15.0   # finding the agents (vLLM worker RPC on first use)
FIRST_VIEW_WAIT_S = 20.0  # the first request waits this long for the first picture
BURST_S, BURST_INTERVAL_S = 1.5, 0.05  # after an action: sample every rank this often, this long
ACTION_PICTURE_MAX_AGE_S = 1.0  # an action decides on the poller's picture when it is this recent
MAX_EVENTS_READ = 1000  # GET /events' largest limit


UNDO = {"drain": "undrain", "failover": "restore"}  # only these two can be refused


@dataclass(frozen=True)
class _Refused:
    detail: str


class ActionError(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


class GroupView:
    def __init__(self, source, refresh_s: float = 0.2):
        self.source = source
        self.refresh_s = refresh_s
        self.snap: Snapshot = EMPTY
        self.refresh_error = ""  # why the last refresh failed ("" when it worked)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._first = threading.Event()   # the first refresh has been tried
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._refresh_lock = threading.Lock()  # publishing a snapshot (never held across a fetch)
        self._folds = 0  # actions folded in so far; a refresh that saw another count does not publish
        self._burst_until = 0.0
        self._last_ok: dict[tuple[str, int], tuple[float, dict]] = {}  # (group, rank) -> (when, state)
        self._client = httpx.Client(timeout=AGENT_TIMEOUT_S, trust_env=False,
                                    limits=httpx.Limits(max_keepalive_connections=64))
        self._fetch_pool = ThreadPoolExecutor(8, thread_name_prefix="r2cc-admin-fetch")
        self._act_pool = ThreadPoolExecutor(1, thread_name_prefix="r2cc-admin-act")  # one action at a time
        self.audit = AuditLog()  # every mutation request through the API (app.py records them)

    # Older readers (metrics, tests) use these names.
    states = property(lambda self: self.snap.states)
    unreachable = property(lambda self: self.snap.unreachable)
    updated = property(lambda self: self.snap.updated)
    agents = property(lambda self: list(self.snap.agents))

    # ---- refreshing (background thread) -------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the poller (idempotent); loop runs the source's async agents() when needed."""
        if self._thread is None or not self._thread.is_alive():
            self._loop = loop
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="r2cc-admin-view", daemon=True)
            self._thread.start()

    async def ensure_running(self) -> None:
        """Start the poller on first use; callers wait (bounded) for the first picture."""
        self.start(asyncio.get_running_loop())
        deadline = time.monotonic() + FIRST_VIEW_WAIT_S
        while not self._first.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    def _run(self) -> None:
        while not self._stop.is_set():
            burst = time.monotonic() < self._burst_until
            try:
                self.refresh(fresh=burst)
            except Exception as exc:  # keep serving the last picture; the next round may work
                self.refresh_error = f"{type(exc).__name__}: {exc}"
                log.debug("r2cc admin view refresh failed: %s", self.refresh_error)
            finally:
                self._first.set()
            self._wake.wait(BURST_INTERVAL_S if burst else self.refresh_s)
            self._wake.clear()

    def _agents(self) -> list[AgentRef]:
        now = getattr(self.source, "agents_now", None)
        got = now() if now is not None else None
        if got is not None:
            return got
        if self._loop is None or self._loop.is_closed():
            return []
        # Sources that need the event loop (vLLM's worker RPC); never called on the loop's thread.
        return asyncio.run_coroutine_threadsafe(self.source.agents(), self._loop).result(AGENTS_TIMEOUT_S)

    def _fetch(self, a: AgentRef, fresh: bool, timeout_s: float = AGENT_TIMEOUT_S) -> dict | str:
        try:
            r = self._client.get(f"http://{a.address}/state" + ("?fresh=1" if fresh else ""),
                                 headers={"Authorization": f"Bearer {a.token}"}, timeout=timeout_s)
            return r.json() if r.status_code == 200 else f"agent answered {r.status_code}"
        except httpx.HTTPError as exc:
            return f"agent unreachable ({type(exc).__name__})"
        except ValueError:
            return "agent answered with malformed JSON"

    def refresh(self, fresh: bool = False, timeout_s: float = AGENT_TIMEOUT_S, allow_stale: bool = True) -> Snapshot:
        """Read every rank's agent (blocking; call from a thread) and publish a new snapshot.
        fresh: ask the agents to sample their rails now instead of giving their last sample.
        A rank that misses this read is shown by its last answer (in `carried`); it is also reported
        unreachable once it has been silent AGENT_STALE_S, or at once when allow_stale is False."""
        # Fetch without the lock: an action's fold must not wait for a slow agent's answer here.
        folds = self._folds
        agents = self._agents()
        results = list(self._fetch_pool.map(lambda a: self._fetch(a, fresh, timeout_s), agents))
        with self._refresh_lock:
            if self._folds != folds:
                return self.snap  # an action folded newer states in meanwhile: ours may predate it
            states, bad, carried = {}, {}, set()
            now = time.monotonic()
            for a, res in zip(agents, results):
                key = (a.group, a.rank)
                if isinstance(res, dict):
                    states[key] = res = self._newest(key, res)
                    self._last_ok[key] = (now, res)
                    continue
                last = self._last_ok.get(key)
                if last is not None:
                    # Its last answer stands in, marked stale, however long it is late: a host's totals
                    # summed over its ranks must not drop (a dashboard would see a counter reset).
                    states[key] = last[1]
                    carried.add(key)
                if last is None or not allow_stale or now - last[0] >= AGENT_STALE_S:
                    bad[key] = res  # a busy worker may miss one poll; a longer silence is reported
            self.snap = Snapshot.build(states, bad, agents, carried=carried)
            self.refresh_error = ""
            return self.snap

    def _newest(self, key: tuple[str, int], st: dict) -> dict:
        """st, or the rank's last answer if that is a later sample of the same process: a poll that
        reached the agent before an action's fresh read (another thread) and returned after it must
        not take the rank's counters back (agents of older builds number no samples)."""
        last = self._last_ok.get(key)
        prev = last[1] if last else {}
        if (isinstance(st.get("seq"), int) and isinstance(prev.get("seq"), int)
                and st.get("process") == prev.get("process") and st["seq"] < prev["seq"]):
            return prev
        return st

    def _fold(self, fresh: dict) -> Snapshot:
        """Publish the current picture with these ranks' newer states (an action's replies)."""
        with self._refresh_lock:
            self._folds += 1
            now = time.monotonic()
            fresh = {key: self._newest(key, st) for key, st in fresh.items()}
            for key, st in fresh.items():
                self._last_ok[key] = (now, st)
            self.snap = self.snap.with_states(fresh)
            return self.snap

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._fetch_pool.shutdown(wait=False)
        self._act_pool.shutdown(wait=False)
        self._client.close()

    # ---- reading (any thread; one snapshot per call) --------------------------------

    def hosts(self) -> dict[str, list[dict]]:
        return self.snap.hosts

    def rails(self) -> list[dict]:
        return self.snap.rails

    def rail(self, host: str, rail: int, snap: Snapshot | None = None) -> dict:
        hosts = (snap or self.snap).hosts
        if host not in hosts:
            raise ActionError(404, f"unknown host {host!r}; known hosts: {', '.join(hosts) or 'none'}")
        for r in hosts[host]:
            if r["rail"] == rail:
                return {"host": host, **r}
        raise ActionError(404, f"host {host!r} has no rail {rail}; it has rails 0..{len(hosts[host]) - 1}")

    def health(self) -> dict:
        return self.snap.health

    def events(self, limit: int = 100, kinds: set[str] | None = None) -> list[dict]:
        """The ranks' rail and peer events and this API's audit events (kind admin), oldest first."""
        evs = [e for e in self.snap.events(MAX_EVENTS_READ) + self.audit.events()
               if kinds is None or e.get("kind", "rail") in kinds]
        return sorted(evs, key=lambda e: e["time"])[-limit:]

    # ---- acting -------------------------------------------------------------------

    async def act(self, host: str, rail: int, action: str, force: bool = False, reason: str | None = None,
                  by: str | None = None) -> dict:
        """reason, by (a token fingerprint): kept by the ranks with a drain or failover."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._act_pool, self._act, host, rail, action, force, reason, by)

    def _act(self, host: str, rail: int, action: str, force: bool, reason: str | None = None,
             by: str | None = None) -> dict:
        known = snap = self.snap
        if not snap.current(ACTION_PICTURE_MAX_AGE_S):
            # Busy workers may answer slowly: an action waits longer for them than the poller does.
            snap = self.refresh(fresh=True, timeout_s=ACTION_TIMEOUT_S, allow_stale=False)
        self._check_reachable(host, rail, action, snap, known)
        target = self.rail(host, rail, snap)  # 404s
        if action in ("drain", "failover") and not force and not target["fallback"]:
            others = [r for r in snap.hosts[host]
                      if r["rail"] != rail and not r["fallback"] and r["state"] in HEALTHY]
            if not others:
                raise ActionError(409, f"rail{rail} is the last healthy rail of {host}; {action} it with "
                                       "?force=true if you mean it (traffic then moves to drained or fallback rails)")
        ranks = [a for a in snap.agents if snap.states.get((a.group, a.rank), {}).get("host") == host]
        path = f"/rails/{rail}/{action}?force={int(force)}"
        note = {"reason": reason, "by": by} if reason or by else None
        warnings: list[str] = []  # done, but a rank could not record it on disk
        replies = list(self._fetch_pool.map(lambda a: self._post(a, path, note, warnings), ranks))
        refused = [r.detail for r in replies if isinstance(r, _Refused)]
        if refused:  # a rank's own check saw the last healthy rail: undo it where it was done
            undo = UNDO[action]
            done = [a for a, r in zip(ranks, replies) if not isinstance(r, (str, _Refused))]
            replies = [self._post(a, f"/rails/{rail}/{undo}") for a in done]
            self._fold({(a.group, a.rank): r for a, r in zip(done, replies) if isinstance(r, dict)})
            raise ActionError(409, refused[0])
        failed = [f"rank {a.rank}: {r}" for a, r in zip(ranks, replies) if isinstance(r, str)]
        snap = self._fold({(a.group, a.rank): r for a, r in zip(ranks, replies) if isinstance(r, dict)})
        self._burst_until = time.monotonic() + BURST_S
        self._wake.set()
        if failed:
            raise ActionError(502, f"{action} reached only some ranks of {host}: {'; '.join(failed)}")
        try:
            state = self.rail(host, rail, snap)["state"]
        except ActionError:  # done, but no reply said how it stands now: GET /rails shows it soon
            state = "unknown"
        return {"host": host, "rail": rail, "action": action, "ranks": [a.rank for a in ranks], "state": state,
                "warnings": warnings}

    @staticmethod
    def _check_reachable(host: str, rail: int, action: str, snap: Snapshot, known: Snapshot) -> None:
        """503 when a rank that is (or was last seen) on `host` did not answer: acting on part of a
        host, or calling a host unknown because its agents were slow, would both be wrong."""
        hosts_of = {k: st["host"] for k, st in known.states.items()} | {k: st["host"] for k, st in snap.states.items()}
        missing = {k: why for k, why in snap.unreachable.items() if hosts_of.get(k, host) == host}
        if missing:
            who = "; ".join(f"{g} rank {r}: {why}" for (g, r), why in sorted(missing.items()))
            raise ActionError(503, f"{action} {host} rail{rail} not done: the control agent of a rank on that host "
                                   f"did not answer ({who}); nothing was changed, retry in a moment")

    def _post(self, a: AgentRef, path: str, note: dict | None = None,
              warnings: list | None = None) -> "dict | str | _Refused | None":
        """The agent's state right after it did the action (None: done, but its reply had no state),
        _Refused when its last-healthy-rail check said no, or why it was not done.
        note: reason and by, for the agent to record; the agent's warnings go to `warnings`."""
        try:
            r = self._client.post(f"http://{a.address}{path}", headers={"Authorization": f"Bearer {a.token}"},
                                  content=json.dumps(note) if note else None, timeout=ACTION_TIMEOUT_S)
        except httpx.HTTPError as exc:
            return f"agent unreachable ({type(exc).__name__})"
        if r.status_code == 409:
            try:
                return _Refused(r.json().get("detail", r.text[:300]))
            except ValueError:
                return _Refused(r.text[:300])
        if r.status_code != 200:
            return f"agent answered {r.status_code}: {r.text[:200]}"
        try:
            reply = r.json()
        except ValueError:
            return None
        if not isinstance(reply, dict):
            return None
        if warnings is not None and reply.get("warning"):
            warnings.append(f"rank {a.rank}: {reply['warning']}")
        state = reply.get("state")
        return state if isinstance(state, dict) else None
