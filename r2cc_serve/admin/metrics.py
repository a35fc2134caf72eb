"""Every r2cc Prometheus metric, in one place.

Built on scrape from the admin view's latest snapshot (its poller thread reads every
rank's agent), so worker metrics reach the API server's /metrics on every node without a
multiprocess dir, and a scrape never waits on a worker.
Names: r2cc_ prefix, base units, _total on counters, few labels with few values (host, rail; the
admin API's own mutations by action and result).
"""

from __future__ import annotations

import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from r2cc_serve.admin.snapshot import STATE_ORDER
from r2cc_serve.health.monitor import SPIN_COUNTERS, spin_waits


class R2CCCollector:
    def __init__(self, view, mutations_enabled: bool = True):
        self.view = view
        self.mutations_enabled = mutations_enabled  # an admin token is configured where the API runs

    def describe(self):
        return []  # collected on demand; nothing to pre-register

    def collect(self):
        snap = self.view.snap  # one consistent picture for the whole scrape
        labels = ["host", "rail"]
        up = GaugeMetricFamily("r2cc_rail_up", "1 if the rail carries traffic (up or degraded)", labels=labels)
        state = GaugeMetricFamily("r2cc_rail_state", "1 for the rail's current state", labels=labels + ["state"])
        bw = GaugeMetricFamily("r2cc_rail_bandwidth_bytes_per_second", "measured rail goodput while busy",
                               labels=labels)
        rtt = GaugeMetricFamily("r2cc_rail_rtt_seconds", "heartbeat round-trip time", labels=labels)
        sent = CounterMetricFamily("r2cc_rail_sent_bytes", "payload bytes sent on the rail", labels=labels)
        recv = CounterMetricFamily("r2cc_rail_received_bytes", "payload bytes received on the rail", labels=labels)
        resent = CounterMetricFamily("r2cc_rail_resent_chunks", "chunks re-sent on other rails after a failure",
                                     labels=labels)
        fails = CounterMetricFamily("r2cc_rail_failovers", "times the rail's traffic was moved off it (set aside, failed, "
                                    "or the operator's failover)", labels=labels)
        detect = GaugeMetricFamily("r2cc_rail_detection_seconds", "silence before the rail's last failure was "
                                   "declared (detection latency)", labels=labels)
        flaps = CounterMetricFamily("r2cc_rail_flap_failures", "failures that count towards flapping (not the "
                                    "operator's failovers, nor gray set-asides that cleared)", labels=labels)
        hold = GaugeMetricFamily("r2cc_rail_hold_seconds", "time left of the host's hold on the rail, for "
                                 "flapping or loss (0: not held)", labels=labels)
        retrans = GaugeMetricFamily("r2cc_rail_retransmit_percent", "share of data segments retransmitted on the "
                                    "rail in its last loss window, less those the peer reported as duplicates "
                                    "(worst connection)", labels=labels)
        loss_holds = CounterMetricFamily("r2cc_rail_loss_holds", "times the rail was held out for losing packets",
                                         labels=labels)
        gray = CounterMetricFamily("r2cc_rail_gray_suspects", "times the rail was set aside while the peer still "
                                   "spoke on it (data stuck or crawling: a gray failure)", labels=labels)
        for r in snap.rails:
            lv = [r["host"], str(r["rail"])]
            up.add_metric(lv, 1.0 if r["state"] in ("up", "slow") else 0.0)
            for s in STATE_ORDER:
                state.add_metric(lv + [s], 1.0 if r["state"] == s else 0.0)
            bw.add_metric(lv, r["bandwidth_Bps"])
            rtt.add_metric(lv, r["rtt_s"])
            sent.add_metric(lv, r["bytes_sent"])
            recv.add_metric(lv, r["bytes_received"])
            resent.add_metric(lv, r["chunks_resent"])
            fails.add_metric(lv, r["failovers"])
            detect.add_metric(lv, r["detection_s"])
            flaps.add_metric(lv, r.get("flap_failures", 0))
            hold.add_metric(lv, (r.get("hold") or {}).get("left_s", 0.0))
            retrans.add_metric(lv, r.get("retrans_pct", 0.0))
            loss_holds.add_metric(lv, r.get("loss_holds", 0))
            gray.add_metric(lv, r.get("gray_suspects", 0))
        yield from (up, state, bw, rtt, sent, recv, resent, fails, detect, flaps, hold, retrans, loss_holds, gray)
        yield from self._hosts(snap)
        yield from self._freshness(snap)
        yield from self._peers(snap)
        yield from self._spins(snap)
        yield self._own_stalls(snap)
        yield self._durations(snap)
        yield self._plans(snap)
        token = GaugeMetricFamily("r2cc_admin_token_configured", "1 if drain/failover through this admin API "
                                  "are possible (an admin token is configured), 0 if they are refused")
        token.add_metric([], 1.0 if self.mutations_enabled else 0.0)
        yield token
        yield self._mutations(getattr(self.view, "audit", None))
        health = GaugeMetricFamily("r2cc_health_status", "1 for the group's current health", labels=["status"])
        current = snap.health["status"]
        for s in ("ok", "degraded", "down"):
            health.add_metric([s], 1.0 if s == current else 0.0)
        yield health

    @staticmethod
    def _mutations(audit):
        """Drain, undrain, failover and restore requests to this admin API, by what they got
        (ok, unauthorized, forbidden, not_found, conflict, invalid, partial, unavailable, error)."""
        c = CounterMetricFamily("r2cc_admin_mutations", "mutation requests to this admin API, allowed or "
                                "refused (each one is an event of kind admin in /r2cc/v1/events)",
                                labels=["action", "result"])
        for (action, result), n in sorted((audit.counts() if audit is not None else {}).items()):
            c.add_metric([action, result], n)
        return c

    @staticmethod
    def _hosts(snap):
        """Per host: how many data rails it has and how many carry traffic, and which rail is the
        fallback (management network) rail, to join with the per-rail series."""
        rails = GaugeMetricFamily("r2cc_host_rails", "data rails of the host (the fallback rail not counted)",
                                  labels=["host"])
        rails_up = GaugeMetricFamily("r2cc_host_rails_up", "data rails of the host that carry traffic (up or slow)",
                                     labels=["host"])
        fallback = GaugeMetricFamily("r2cc_rail_fallback", "1 for a fallback rail (management network): joins "
                                     "with r2cc_rail_* on host and rail", labels=["host", "rail"])
        hosts: dict[str, list[int]] = {}
        for r in snap.rails:
            if r["fallback"]:
                fallback.add_metric([r["host"], str(r["rail"])], 1.0)
                hosts.setdefault(r["host"], [0, 0])
                continue
            count = hosts.setdefault(r["host"], [0, 0])
            count[0] += 1
            count[1] += r["state"] in ("up", "slow")
        for host, (n, n_up) in sorted(hosts.items()):
            rails.add_metric([host], n)
            rails_up.add_metric([host], n_up)
        return rails, rails_up, fallback

    @staticmethod
    def _freshness(snap):
        """Per rank: how old the sample behind its series is, and whether it is a late rank's last
        answer, so that a dashboard tells a rank that stopped answering from rails that stopped
        moving bytes (the counters then stand still for both). The oldest of a rank's groups."""
        labels = ["host", "rank"]
        age = GaugeMetricFamily("r2cc_rank_sample_age_seconds", "age of the rank's sample behind the r2cc_rail_* "
                                "and r2cc_peer_* series at this scrape (counters are sampled every "
                                "R2CC_STATUS_REFRESH_MS; more means the rank is late to answer)", labels=labels)
        stale = GaugeMetricFamily("r2cc_rank_stale", "1 while the rank missed the admin view's last poll and its "
                                  "last answer stands in", labels=labels)
        now, ranks = time.time(), {}
        for key, st in sorted(snap.states.items()):
            if st.get("time") is None:  # agents of older builds may not say: no made-up zeros
                continue
            lv = (st["host"], str(key[1]))
            a, carried = ranks.get(lv, (0.0, False))
            # (another host's clock may run ahead of this one)
            ranks[lv] = (max(a, now - st["time"], 0.0), carried or key in snap.carried)
        for lv, (a, carried) in sorted(ranks.items()):
            age.add_metric(list(lv), a)
            stale.add_metric(list(lv), 1.0 if carried else 0.0)
        return age, stale

    @staticmethod
    def _plans(snap):
        info = GaugeMetricFamily("r2cc_plan_schedule", "1 for the all_reduce schedule setting each group runs "
                                 "(R2CC_SCHEDULE or set_schedule; `auto` picks per size, see /r2cc/v1/plan)",
                                 labels=["group", "schedule"])
        for p in snap.plans():
            info.add_metric([p["group"], p["schedule"]], 1.0)
        return info

    @staticmethod
    def _peers(snap):
        """Stalled peers as each host sees them (a process silent while its host acknowledges), and
        the chunk size each host now cuts bulk messages to the peer into."""
        labels = ["host", "peer"]
        stalled = GaugeMetricFamily("r2cc_peer_stalled", "1 while the peer's process is stalled (no failover: "
                                    "its host still acknowledges)", labels=labels)
        seconds = GaugeMetricFamily("r2cc_peer_stalled_seconds", "how long the current stall has lasted",
                                    labels=labels)
        stalls = CounterMetricFamily("r2cc_peer_stalls", "stalls of the peer's process seen so far", labels=labels)
        chunk = GaugeMetricFamily("r2cc_peer_chunk_bytes", "chunk size of the next bulk message to the peer (about "
                                  "8 ms of its slowest rail, R2CC_MIN_CHUNK_BYTES..R2CC_CHUNK_BYTES)", labels=labels)
        host_of = {k: st["host"] for k, st in snap.states.items()}
        for (group, _), st in sorted(snap.states.items()):
            for p in st.get("peers", []):
                lv = [st["host"], host_of.get((group, p["peer"]), f"rank{p['peer']}")]
                stalled.add_metric(lv, 1.0 if p["stalled"] else 0.0)
                seconds.add_metric(lv, p["stalled_for_s"])
                stalls.add_metric(lv, p["stalls"])
                if "chunk_bytes" in p:  # agents of older builds do not report it
                    chunk.add_metric(lv, p["chunk_bytes"])
        return stalled, seconds, stalls, chunk

    @staticmethod
    def _spins(snap):
        """How each rank's waits went (R2CC_SPIN_US): spun and got the bytes, spun for nothing,
        or slept at once because the host's CPU was wanted; and the CPU pressure that gate saw.
        Summed over the rank's groups: they share its threads and its host."""
        waits = CounterMetricFamily("r2cc_spin_waits", "waits for a collective's bytes by how they went: hit (spun "
                                    "and got them), miss (spun for nothing, then slept), skip (slept at once: the "
                                    "host's CPU was under pressure)", labels=["host", "rank", "outcome"])
        briefs = CounterMetricFamily("r2cc_spin_brief_waits", "of the waits that spun (hit or miss), those that "
                                     "polled only briefly (50 us at most) because the host's CPU was under pressure",
                                     labels=["host", "rank"])
        pressure = GaugeMetricFamily("r2cc_host_cpu_pressure", "share of the last ~second some thread on the host "
                                     "waited for a core, as r2cc's spin gate sees it (sampled only while "
                                     "R2CC_SPIN_US > 0)", labels=["host"])
        per_rank: dict[tuple[str, str], list[dict]] = {}
        for (_, rank), st in sorted(snap.states.items()):
            per_rank.setdefault((st["host"], str(rank)), []).append(st)
        per_host: dict[str, float] = {}
        for (host, rank), states in per_rank.items():
            spins = spin_waits(states)
            if not spins:  # agents of older builds do not report them
                continue
            for outcome, key in (("hit", "spin_hits"), ("miss", "spin_misses"), ("skip", "spin_skips")):
                waits.add_metric([host, rank, outcome], spins[key])
            briefs.add_metric([host, rank], spins["spin_briefs"])
            per_host[host] = max(per_host.get(host, 0.0), spins["cpu_pressure"])
        for host, value in sorted(per_host.items()):
            pressure.add_metric([host], value)
        return waits, briefs, pressure

    @staticmethod
    def _own_stalls(snap):
        """Times each rank's process was held up (no CPU, swapped) for over half a rail timeout.
        Every group of a rank sees the same stall in its own watchdog: the most any saw, not the sum."""
        c = CounterMetricFamily("r2cc_process_stalls", "times this rank's process was held up for over half "
                                "a rail timeout (no CPU, swapped); rails' silence and progress are judged "
                                "afresh after one, so a starved host detects faults later", labels=["host", "rank"])
        most: dict[tuple[str, str], int] = {}
        for (_, rank), st in snap.states.items():
            n = (st.get("counters") or {}).get("own_stalls")
            if n is not None:  # agents of older builds do not report it
                key = (st["host"], str(rank))
                most[key] = max(most.get(key, 0), int(n))
        for (host, rank), n in sorted(most.items()):
            c.add_metric([host, rank], n)
        return c

    @staticmethod
    def _durations(snap):
        h = HistogramMetricFamily("r2cc_collective_duration_seconds", "time of one collective call", labels=["host"])
        for st in snap.states.values():
            d = st.get("durations")
            if not d:
                continue
            cumulative, buckets = 0, []
            for bound, count in zip(d["bounds"], d["counts"]):
                cumulative += count
                buckets.append((repr(bound), cumulative))
            buckets.append(("+Inf", cumulative + d["counts"][-1]))
            h.add_metric([f"{st['host']}/rank{st['rank']}"], buckets, d["sum"])
        return h
