"""The operator's view of a group: every host's rails, health and events, kept fresh.

A `GroupView` polls the control agents of all ranks (concurrently, short timeouts)
every R2CC_ADMIN_REFRESH_MS in the background, so reads are served from memory and
stay fast while the engine is busy. Actions go to the agents of every rank on the
named host; peers learn of a drain through the transport itself.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from r2cc_serve.admin.sources import AgentRef

# Worst first: a rail shown for a host takes the worst state of its connections.
STATE_ORDER = ["down", "recovering", "connecting", "draining", "drained", "degraded", "up"]
AGENT_TIMEOUT_S = 1.0


class ActionError(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


def _rail_view(conns: list[dict]) -> dict:
    first = conns[0]
    state = min((c["state"] for c in conns), key=STATE_ORDER.index)
    last = max(conns, key=lambda c: c["last_error_time"])
    return {
        "rail": first["rail"], "interface": first.get("interface", f"rail{first['rail']}"),
        "address": first["address"], "fallback": first.get("fallback", False), "state": state,
        "peers": sorted({c["peer_host"] for c in conns}),
        "bandwidth_Bps": sum(c["bandwidth_Bps"] for c in conns),
        "rtt_s": max(c["rtt_s"] for c in conns),
        "bytes_sent": sum(c["bytes_sent"] for c in conns), "bytes_received": sum(c["bytes_recv"] for c in conns),
        "chunks_resent": sum(c["chunks_resent"] for c in conns), "bytes_resent": sum(c["bytes_resent"] for c in conns),
        "failovers": sum(c["failovers"] for c in conns),
        "detection_s": max((c["last_detect_s"] for c in conns), default=0.0),
        "last_error": last["last_error"] or None,
        "last_error_time": last["last_error_time"] or None,
        "connections": [{k: c[k] for k in ("peer", "peer_host", "state", "bytes_sent", "bytes_recv",
                                           "chunks_resent", "failovers", "last_error")} for c in conns],
    }


def _mark_degraded(rails: list[dict]) -> None:
    """An up rail measured at under a quarter of the best of its host's rails is shown as degraded
    (a rate cut; smaller differences are measurement noise on busy hosts)."""
    bws = [r["bandwidth_Bps"] for r in rails if r["state"] == "up" and not r["fallback"] and r["bandwidth_Bps"] > 0]
    if len(bws) < 2:
        return
    best = max(bws)
    for r in rails:
        if r["state"] == "up" and not r["fallback"] and 0 < r["bandwidth_Bps"] < best / 4:
            r["state"] = "degraded"


class GroupView:
    def __init__(self, source, refresh_s: float = 0.2):
        self.source = source
        self.refresh_s = refresh_s
        self.states: dict[tuple[str, int], dict] = {}  # (group, rank) -> agent snapshot
        self.unreachable: dict[tuple[str, int], str] = {}
        self.agents: list[AgentRef] = []
        self.updated = 0.0
        self._task: asyncio.Task | None = None
        self._client: httpx.AsyncClient | None = None

    # ---- refreshing ---------------------------------------------------------------

    async def ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._client = httpx.AsyncClient(timeout=AGENT_TIMEOUT_S)
            await self.refresh()
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.refresh()
            except Exception:  # keep serving the last view; the next round may succeed
                pass

    async def _fetch(self, a: AgentRef) -> tuple[AgentRef, dict | str]:
        try:
            r = await self._client.get(f"http://{a.address}/state", headers={"Authorization": f"Bearer {a.token}"})
            return a, (r.json() if r.status_code == 200 else f"agent answered {r.status_code}")
        except httpx.HTTPError as exc:
            return a, f"agent unreachable ({type(exc).__name__})"

    async def refresh(self) -> None:
        self.agents = await self.source.agents()
        results = await asyncio.gather(*(self._fetch(a) for a in self.agents))
        states, bad = {}, {}
        for a, res in results:
            (states if isinstance(res, dict) else bad)[(a.group, a.rank)] = res
        self.states, self.unreachable, self.updated = states, bad, time.time()

    # ---- reading ------------------------------------------------------------------

    def _host_of(self) -> dict[tuple[str, int], str]:
        return {k: s["host"] for k, s in self.states.items()}

    def hosts(self) -> dict[str, list[dict]]:
        """host -> its rails (each the aggregate of that rail's connections on that host)."""
        host_of = self._host_of()
        grouped: dict[str, dict[int, list[dict]]] = {}
        for (group, _), st in sorted(self.states.items()):
            for c in st["rails"]:
                c = dict(c, peer_host=host_of.get((group, c["peer"]), f"rank{c['peer']}"))
                grouped.setdefault(st["host"], {}).setdefault(c["rail"], []).append(c)
        out = {}
        for host, rails in sorted(grouped.items()):
            views = [_rail_view(conns) for _, conns in sorted(rails.items())]
            _mark_degraded(views)
            out[host] = views
        return out

    def rails(self) -> list[dict]:
        return [{"host": h, **r} for h, rails in self.hosts().items() for r in rails]

    def rail(self, host: str, rail: int) -> dict:
        hosts = self.hosts()
        if host not in hosts:
            raise ActionError(404, f"unknown host {host!r}; known hosts: {', '.join(hosts) or 'none'}")
        for r in hosts[host]:
            if r["rail"] == rail:
                return {"host": host, **r}
        raise ActionError(404, f"host {host!r} has no rail {rail}; it has rails 0..{len(hosts[host]) - 1}")

    def health(self) -> dict:
        if not self.states and not self.unreachable:
            return {"status": "down", "reasons": ["no r2cc group is attached (no control agent found)"],
                    "updated": self.updated}
        status, reasons = "ok", []
        for (group, rank), st in sorted(self.states.items()):
            reasons += [f"{st['host']} (rank {rank}): {r}" for r in st["reasons"]]
            if st["status"] == "down":
                status = "down"
            elif st["status"] == "degraded" and status == "ok":
                status = "degraded"
        for (group, rank), why in sorted(self.unreachable.items()):
            reasons.append(f"{group} rank {rank}: {why}")
            status = "down" if status == "down" else "degraded"
        for r in self.rails():
            if r["state"] == "degraded":
                reasons.append(f"{r['host']} rail{r['rail']} runs at under a quarter of the bandwidth of its best rail")
                status = "degraded" if status == "ok" else status
        return {"status": status, "reasons": reasons, "updated": self.updated}

    def events(self, limit: int = 100) -> list[dict]:
        evs = [e for st in self.states.values() for e in st.get("events", [])]
        return sorted(evs, key=lambda e: e["time"])[-limit:]

    # ---- acting -------------------------------------------------------------------

    async def act(self, host: str, rail: int, action: str, force: bool = False) -> dict:
        await self.refresh()
        target = self.rail(host, rail)  # 404s
        if action in ("drain", "failover") and not force and not target["fallback"]:
            others = [r for r in self.hosts()[host]
                      if r["rail"] != rail and not r["fallback"] and r["state"] in ("up", "degraded")]
            if not others:
                raise ActionError(409, f"rail{rail} is the last healthy rail of {host}; {action} it with "
                                       "?force=true if you mean it (traffic then moves to drained or fallback rails)")
        ranks = [a for a in self.agents if self.states.get((a.group, a.rank), {}).get("host") == host]
        replies = await asyncio.gather(*(self._client.post(
            f"http://{a.address}/rails/{rail}/{action}", headers={"Authorization": f"Bearer {a.token}"})
            for a in ranks), return_exceptions=True)
        failed = [f"rank {a.rank}: {r if isinstance(r, Exception) else r.status_code}"
                  for a, r in zip(ranks, replies) if isinstance(r, Exception) or r.status_code != 200]
        if failed:
            raise ActionError(502, f"{action} reached only some ranks of {host}: {'; '.join(failed)}")
        await self.refresh()
        return {"host": host, "rail": rail, "action": action, "ranks": [a.rank for a in ranks],
                "state": self.rail(host, rail)["state"]}
