"""One immutable picture of a group, built from every rank agent's state (pure functions).

A `Snapshot` is made once per refresh, off the event loop, with the JSON bodies of the hot
reads (GET /rails, GET /health) already encoded, so serving them costs no more than
returning bytes. Readers take `view.snap` once and use that object only.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

from r2cc_serve.admin.auth import REDACTED

# Worst first: a rail shown for a host takes the worst state of its connections.
# A rail's state says how it carries data; "degraded" is a health status only (ok / degraded / down).
# held: flap dampening keeps a flapping rail out for a while (connected, probed, no new chunks).
STATE_ORDER = ["aborted", "down", "recovering", "connecting", "held", "draining", "drained", "slow", "up"]
HEALTHY = ("up", "slow")


def rail_view(conns: list[dict]) -> dict:
    """One host's rail: the aggregate of that rail's connections to every peer."""
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
        "flap_failures": sum(c.get("flap_failures", 0) for c in conns),
        "retrans_pct": max((c.get("retrans_pct", 0.0) for c in conns), default=0.0),
        "loss_holds": sum(c.get("loss_holds", 0) for c in conns),
        "gray_suspects": sum(c.get(k, 0) for c in conns for k in ("stuck_suspects", "mute_suspects", "slow_suspects")),
        "detection_s": max((c["last_detect_s"] for c in conns), default=0.0),
        "last_error": last["last_error"] or None,
        "last_error_time": last["last_error_time"] or None,
        "connections": [{k: c[k] for k in ("peer", "peer_host", "state", "bytes_sent", "bytes_recv",
                                           "chunks_resent", "failovers", "last_error")} for c in conns],
        "decisions": _decisions(conns),
        "hold": _hold(conns),
    }


def _hold(conns: list[dict]) -> dict | None:
    """A hold on this host's rail (flapping or lossy): the connection held longest says why and for how long
    (None when no connection to any peer is held; agents of older builds report no hold)."""
    held = [c for c in conns if c.get("hold_reason")]
    if not held:
        return None
    longest = max(held, key=lambda c: c.get("hold_left_s", 0.0))
    return {"reason": longest["hold_reason"], "left_s": max(c.get("hold_left_s", 0.0) for c in conns),
            "failures": sum(c.get("flap_failures", 0) for c in conns), "holds": sum(c.get("holds", 0) for c in conns),
            "penalty": max(c.get("flap_penalty", 0.0) for c in conns)}


def _decisions(conns: list[dict]) -> list[dict]:
    """The operator's decisions on this rail of the host, one per action (every rank of the host
    keeps the same record; the latest wins where two differ for a moment)."""
    latest: dict[str, dict] = {}
    for c in conns:
        for d in c.get("decisions", ()):  # agents of older builds report none
            if d["action"] not in latest or d["at"] > latest[d["action"]]["at"]:
                latest[d["action"]] = d
    return [latest[a] for a in sorted(latest)]


# Who made a decision (`by`, a token fingerprint) is audit detail: readers without the mutation
# token get it as "redacted" (auth.NO_AUDIT_DETAIL), in /rails and in /health's reasons.
_BY_IN_TEXT = re.compile(r"\bby [0-9a-f]{8} at ")


def without_decision_authors(rails: list[dict]) -> list[dict]:
    """rails with every decision's `by` redacted; the same list when no rail has a decision."""
    if not any(r.get("decisions") for r in rails):
        return rails
    return [dict(r, decisions=[dict(d, by=REDACTED) for d in r["decisions"]]) if r.get("decisions") else r
            for r in rails]


def without_decision_authors_in(health: dict) -> dict:
    """health with the fingerprints in its reasons ("rail1 drain by 1a2b3c4d at ...") redacted."""
    reasons = [_BY_IN_TEXT.sub(f"by {REDACTED} at ", r) for r in health.get("reasons", ())]
    return health if reasons == health.get("reasons", []) else dict(health, reasons=reasons)


def without_audit_detail(ev: dict) -> dict:
    """An event as a reader without the mutation token sees it: an admin event's client address
    and token fingerprint redacted."""
    return dict(ev, by=REDACTED, client=REDACTED) if ev.get("kind") == "admin" else ev


def mark_slow(rails: list[dict]) -> None:
    """An up rail measured at under a quarter of the best of its host's rails is shown as slow
    (a rate cut; smaller differences are measurement noise on busy hosts)."""
    bws = [r["bandwidth_Bps"] for r in rails if r["state"] == "up" and not r["fallback"] and r["bandwidth_Bps"] > 0]
    if len(bws) < 2:
        return
    best = max(bws)
    for r in rails:
        if r["state"] == "up" and not r["fallback"] and 0 < r["bandwidth_Bps"] < best / 4:
            r["state"] = "slow"


def group_hosts(states: dict[tuple[str, int], dict], carried=frozenset()) -> dict[str, list[dict]]:
    """host -> its rails, from {(group, rank): agent state}; carried: the ranks whose state is a late
    rank's last answer. Each rail says when its numbers were sampled (`sampled_at`: the oldest
    sample of the host's ranks, None from agents that do not say) and whether a late answer stands
    in (`stale`): counters lag by up to R2CC_STATUS_REFRESH_MS, more while a rank is late."""
    host_of = {k: s["host"] for k, s in states.items()}
    grouped: dict[str, dict[int, list[dict]]] = {}
    ranks: dict[str, list[tuple[str, int]]] = {}  # host -> the ranks its rails come from
    for key, st in sorted(states.items()):
        for c in st["rails"]:
            c = dict(c, peer_host=host_of.get((key[0], c["peer"]), f"rank{c['peer']}"))
            grouped.setdefault(st["host"], {}).setdefault(c["rail"], []).append(c)
        ranks.setdefault(st["host"], []).append(key)
    out = {}
    for host, rails in sorted(grouped.items()):
        views = [rail_view(conns) for _, conns in sorted(rails.items())]
        mark_slow(views)
        times = [states[k].get("time") for k in ranks[host]]
        sampled_at = None if None in times else min(times)
        stale = any(k in carried for k in ranks[host])
        out[host] = [dict(v, sampled_at=sampled_at, stale=stale) for v in views]
    return out


def group_health(states: dict, unreachable: dict, rails: list[dict], updated: float) -> dict:
    if not states and not unreachable:
        return {"status": "down", "reasons": ["no r2cc group is attached (no control agent found)"],
                "updated": updated}
    status, reasons = "ok", []
    for (group, rank), st in sorted(states.items()):
        reasons += [f"{st['host']} (rank {rank}): {r}" for r in st["reasons"]]
        if st["status"] == "down":
            status = "down"
        elif st["status"] == "degraded" and status == "ok":
            status = "degraded"
    for (group, rank), why in sorted(unreachable.items()):
        reasons.append(f"{group} rank {rank}: {why}")
        status = "down" if status == "down" else "degraded"
    for r in rails:
        if r["state"] == "slow":
            reasons.append(f"{r['host']} rail{r['rail']} runs at under a quarter of the bandwidth of its best rail")
            status = "degraded" if status == "ok" else status
    return {"status": status, "reasons": reasons, "updated": updated}


def group_plans(states: dict) -> list[dict]:
    """{(group, rank): agent state} -> one entry per group. Every rank plans alike from the same
    table, so rank order shows one plan; `agreed` says whether every rank reports the same epoch
    (false for a moment while a new table spreads, or with agents of mixed versions)."""
    by_group: dict[str, list[tuple[int, dict, str]]] = {}
    for (group, rank), st in sorted(states.items()):
        by_group.setdefault(group, []).append((rank, st.get("plan") or {"schedule": "builtin"}, st["host"]))
    out = []
    for group, ranks in by_group.items():
        first = ranks[0][1]
        bw = (first.get("bandwidth_Bps") or {}).get("out") or []
        out.append({"group": group, "schedule": first.get("schedule", "builtin"), "epoch": first.get("epoch"),
                    "agreed": len({r[1].get("epoch") for r in ranks}) == 1,
                    "ranks": [{"rank": rank, "host": host, "epoch": plan.get("epoch"),
                               "bandwidth_Bps": bw[rank] if rank < len(bw) else None}
                              for rank, plan, host in ranks],
                    "choices": first.get("choices", [])})
    return out


@dataclass(frozen=True)
class Snapshot:
    states: dict = field(default_factory=dict)       # (group, rank) -> that rank agent's state
    unreachable: dict = field(default_factory=dict)  # (group, rank) -> why it did not answer
    agents: tuple = ()                               # AgentRef of every rank
    updated: float = 0.0                             # unix time of the refresh
    hosts: dict = field(default_factory=dict)        # host -> its rails
    rails: list = field(default_factory=list)        # every host's rails, with "host"
    health: dict = field(default_factory=dict)
    rails_json: bytes = b""                          # GET /rails body
    health_json: bytes = b""                         # GET /health body
    carried: frozenset = frozenset()                 # (group, rank) whose state is a late rank's last answer
    answered: float = 0.0                            # unix time of the oldest answer in it (<= updated)
    rails_json_redacted: bytes = b""                 # the same without the audit detail (auth.NO_AUDIT_DETAIL)
    health_json_redacted: bytes = b""

    @classmethod
    def build(cls, states: dict, unreachable: dict, agents, updated: float | None = None,
              carried=frozenset(), answered: float | None = None) -> "Snapshot":
        updated = time.time() if updated is None else updated
        hosts = group_hosts(states, carried)
        rails = [{"host": h, **r} for h, rs in hosts.items() for r in rs]
        health = group_health(states, unreachable, rails, updated)
        rails_json, health_json = json.dumps({"rails": rails, "updated": updated}).encode(), json.dumps(health).encode()
        bare_rails, bare_health = without_decision_authors(rails), without_decision_authors_in(health)
        return cls(states, unreachable, tuple(agents), updated, hosts, rails, health, rails_json, health_json,
                   frozenset(carried), updated if answered is None else answered,
                   rails_json if bare_rails is rails else json.dumps({"rails": bare_rails, "updated": updated}).encode(),
                   health_json if bare_health is health else json.dumps(bare_health).encode())

    def current(self, max_age_s: float) -> bool:
        """Every rank answered within max_age_s: fit to decide an action on."""
        return (bool(self.states) and not self.unreachable and not self.carried
                and time.time() - self.answered <= max_age_s)

    def with_states(self, fresh: dict) -> "Snapshot":
        """This picture with some ranks' states replaced by newer answers (an action's replies).
        Published now, but as old as the answers it keeps."""
        unreachable = {k: v for k, v in self.unreachable.items() if k not in fresh}
        kept = set(self.states) - set(fresh)
        return Snapshot.build({**self.states, **fresh}, unreachable, self.agents, carried=self.carried - set(fresh),
                              answered=self.answered if kept else None)

    def plans(self) -> list[dict]:
        """Per group: the all_reduce schedule and the bandwidth table its ranks agreed on."""
        return group_plans(self.states)

    def events(self, limit: int = 100) -> list[dict]:
        evs = [e for st in self.states.values() for e in st.get("events", [])]
        return sorted(evs, key=lambda e: e["time"])[-limit:]


EMPTY = Snapshot.build({}, {}, (), updated=0.0)
