"""The operator admin API through vLLM's own API server (--distributed-backend r2cc).

Deployment (a), one vLLM TP=2 with rank r's rails in lab host r (TestSingleInstance): while
4 greedy streams decode, an operator drains, undrains, fails over and restores rails with
POSTs to vLLM's port; every action must show on every rank through GET /r2cc/v1/rails
within 1 s, the counters and vLLM's /metrics must agree, no request may fail and every
token must equal the fault-free reference of vLLM's default backend. The admin reads must
stay fast under that load (GET /rails p99 against vLLM's own /health).

Deployment (b), two vLLM nodes (TestTwoNodes): node 1's workers reach node 0's API server
only through vLLM's worker RPC and the management network; a drain of a node-1 rail must
show the same way, with node 1's metrics on node 0's /metrics.

The classes use conftest.py's shared deployments (r2cc_single, r2cc_two_nodes; one vLLM at a
time). The two-node class is marked slow: `pytest -m vllm tests/e2e/test_d_admin_in_vllm.py`
runs it, the default run (-m 'not slow') leaves it out.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from r2cc_serve import envs
from r2cc_testbed.serving import admin_latency as probe
from r2cc_testbed.serving.load import compare, run_load
from tests.e2e.conftest import ADMIN_TOKEN as TOKEN
from tests.e2e.conftest import LOAD

USES_SHARED_DEPLOYMENT = True
VISIBLE_S = 1.0       # an action must show on every rank within this (the bound)
RECOVER_S = 20.0      # undrain/restore: probing and re-admission, stale ARP included
HEALTHY = ("up", "slow")  # slow = up, measured slower than a quarter of the best rail


@pytest.fixture(scope="class")
def dep(r2cc_single):
    return r2cc_single


@pytest.fixture(scope="class")
def dep2(r2cc_two_nodes):
    return r2cc_two_nodes


class Admin:
    """A real HTTP client of the admin API on vLLM's port."""

    def __init__(self, url: str):
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=10.0, trust_env=False)

    def rails_doc(self) -> tuple[dict[tuple[str, int], dict], float]:
        """({(host, rail): rail}, the unix time the server's snapshot was taken)."""
        r = self.http.get("/r2cc/v1/rails")
        assert r.status_code == 200, f"GET /r2cc/v1/rails: HTTP {r.status_code} {r.text[:300]}"
        doc = r.json()
        return {(x["host"], x["rail"]): x for x in doc["rails"]}, doc["updated"]

    def rails(self) -> dict[tuple[str, int], dict]:
        return self.rails_doc()[0]

    def act(self, host: str, rail: int, action: str, token: str | None = TOKEN) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return self.http.post(f"/r2cc/v1/rails/{host}/{rail}/{action}", headers=headers)

    def must(self, host: str, rail: int, action: str) -> float:
        """POST an action that must succeed; returns the time.time() when it was sent (the moment
        the operator asked: "effective within 1 s" counts from there)."""
        t0 = time.time()
        r = self.act(host, rail, action)
        assert r.status_code == 200, f"{action} {host} rail{rail}: HTTP {r.status_code} {r.text[:300]}"
        _note(f"POST {action} {host} rail{rail} answered in {time.time() - t0:.3f} s")
        return t0

    def wait(self, keys: list[tuple[str, int]], states: tuple[str, ...], since: float, timeout_s: float) -> float:
        """Seconds from `since` (time.time()) until GET showed every (host, rail) in keys in one of
        states. Timed by the server's snapshot time when that is earlier than our receipt: on a
        loaded 2-core box this client may wait long for a CPU, which is not the server's delay."""
        deadline = since + timeout_s
        while True:
            seen, updated = self.rails_doc()
            now = time.time()
            if all(seen[k]["state"] in states for k in keys):
                return max(0.0, min(now, updated) - since)
            if now > deadline:
                raise AssertionError(f"after {now - since:.2f} s GET still shows "
                                     f"{ {k: seen[k]['state'] for k in keys} }, want {states}")
            time.sleep(0.02)

    def metrics(self) -> dict[tuple[str, tuple], float]:
        """{(sample name, sorted labels): value} of every r2cc_ sample on vLLM's /metrics."""
        r = self.http.get("/metrics")
        assert r.status_code == 200, f"GET /metrics: HTTP {r.status_code}"
        out = {}
        for fam in text_string_to_metric_families(r.text):
            for s in fam.samples:
                if s.name.startswith("r2cc_"):
                    out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out


def _m(metrics: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in metrics, f"{name}{labels} missing from vLLM's /metrics; r2cc samples: {len(metrics)}"
    return metrics[key]


def _note(msg: str) -> None:
    print(f"[admin-e2e] {msg}", file=sys.stderr, flush=True)


def check_listing_auth_and_metrics(dep, hosts: list[str]) -> None:
    admin = Admin(dep.url)
    rails = admin.rails()
    assert sorted({h for h, _ in rails}) == hosts, sorted(rails)
    for h in hosts:  # four data rails and the management fallback, on each rank
        assert [k for (hh, k) in sorted(rails) if hh == h] == [0, 1, 2, 3, 4], sorted(rails)
        assert [rails[(h, k)]["fallback"] for k in range(5)] == [False] * 4 + [True]
        assert all(rails[(h, k)]["state"] in HEALTHY for k in range(5)), {k: v["state"] for k, v in rails.items()}
    # Mutations need the token.
    assert admin.act(hosts[0], 1, "drain", token=None).status_code == 401
    assert admin.act(hosts[0], 1, "drain", token="wrong").status_code == 401
    assert admin.act("no-such-host", 1, "drain").status_code == 404
    assert admin.rails()[(hosts[0], 1)]["state"] in HEALTHY  # nothing happened
    # Every worker's metrics on vLLM's /metrics; the warm-up request already went through r2cc.
    m = admin.metrics()
    for h in hosts:
        for k in range(5):
            assert _m(m, "r2cc_rail_up", host=h, rail=str(k)) == 1.0
    assert sum(_m(m, "r2cc_rail_sent_bytes_total", host=h, rail=str(k)) for h in hosts for k in range(4)) > 0
    # Durations reach /metrics through two samplers (each rank's monitor, the API's view of every
    # rank): on a busy box a sample can lag the warm-up, so wait for it, bounded.
    deadline = time.monotonic() + 15
    while True:
        counts = {lbl: v for (name, lbl), v in m.items() if name == "r2cc_collective_duration_seconds_count"}
        if (len(counts) == 2 and all(v > 0 for v in counts.values())) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
        m = admin.metrics()
    assert len(counts) == 2 and all(v > 0 for v in counts.values()), counts


def check_actions_during_load(dep, h0: str, h1: str, reference) -> dict:
    """Drain, the 409 guard, undrain, failover and restore through vLLM's port while 4 streams
    decode; returns the measured times."""
    admin = Admin(dep.url)
    spec = dataclasses.replace(LOAD, duration_s=45.0)
    box: dict = {}
    load = threading.Thread(target=lambda: box.update(run=run_load(dep.url, dep.model, spec)), daemon=True)
    load.start()
    time.sleep(3.0)  # streams in flight
    started = time.time()
    before = admin.rails()
    fails_before = _m(admin.metrics(), "r2cc_rail_failovers_total", host=h1, rail="2")

    # Drain h0 rail1: effective on both ranks within 1 s; no byte moves on it afterwards.
    drain_s = admin.wait([(h0, 1), (h1, 1)], ("drained",), admin.must(h0, 1, "drain"), timeout_s=5.0)
    _note(f"drain of {h0} rail1 shown drained on every rank {drain_s:.3f} s after the POST was sent")
    frozen = admin.rails()
    time.sleep(2.0)
    later = admin.rails()
    assert [later[(h, 1)]["bytes_sent"] for h in (h0, h1)] == [frozen[(h, 1)]["bytes_sent"] for h in (h0, h1)]
    moved = sum(later[(h, k)]["bytes_sent"] - frozen[(h, k)]["bytes_sent"] for h in (h0, h1) for k in (0, 2, 3))
    assert moved > 0, "no bytes moved on the other rails while rail1 was drained: was the load running?"
    m = admin.metrics()
    assert _m(m, "r2cc_rail_up", host=h0, rail="1") == 0.0
    assert _m(m, "r2cc_rail_state", host=h0, rail="1", state="drained") == 1.0
    assert _m(m, "r2cc_rail_state", host=h1, rail="1", state="drained") == 1.0
    health = admin.http.get("/r2cc/v1/health").json()
    assert health["status"] == "degraded" and any("rail1" in r for r in health["reasons"]), health

    # The last healthy rail of a host is protected.
    for k in (0, 2):
        admin.must(h0, k, "drain")
    r = admin.act(h0, 3, "drain")
    assert r.status_code == 409 and "last healthy rail" in r.json()["detail"], r.text
    for k in (0, 1, 2):
        admin.must(h0, k, "undrain")
    admin.wait([(h, k) for h in (h0, h1) for k in range(4)], HEALTHY, time.time(), RECOVER_S)

    # Fail over h1 rail2: down on both ranks within 1 s, counted, then restored.
    fail_s = admin.wait([(h0, 2), (h1, 2)], ("down",), admin.must(h1, 2, "failover"), timeout_s=5.0)
    _note(f"failover of {h1} rail2 shown down on every rank {fail_s:.3f} s after the POST was sent")
    after = admin.rails()
    assert after[(h1, 2)]["failovers"] > before[(h1, 2)]["failovers"], (before[(h1, 2)], after[(h1, 2)])
    m = admin.metrics()
    assert _m(m, "r2cc_rail_up", host=h1, rail="2") == 0.0
    assert _m(m, "r2cc_rail_failovers_total", host=h1, rail="2") > fails_before
    restore_s = admin.wait([(h0, 2), (h1, 2)], HEALTHY, admin.must(h1, 2, "restore"), RECOVER_S)
    actions_done = time.time()

    events = admin.http.get("/r2cc/v1/events", params={"limit": 1000, "kind": "rail"}).json()["events"]
    seen = {(e["host"], e["rail"], e["to"]) for e in events if e["time"] >= started - 1}
    assert (h0, 1, "drained") in seen and (h1, 2, "down") in seen, sorted(seen)

    load.join(timeout=spec.deadline_s + 30)
    run = box.get("run")
    assert run is not None, "the load did not finish within its deadline"
    assert not run.failed, run.summary()
    assert compare(reference, run) == []
    assert len(run.gaps(started, actions_done)) > 0, "no token streamed while the operator acted"
    assert drain_s <= VISIBLE_S and fail_s <= VISIBLE_S, (drain_s, fail_s)
    _note(f"restore back up on every rank after {restore_s:.3f} s; load: {run.summary()}")
    return {"drain_s": drain_s, "failover_s": fail_s, "restore_s": restore_s}


class TestSingleInstance:
    def test_rails_of_both_ranks_auth_and_worker_metrics(self, dep, lab):
        check_listing_auth_and_metrics(dep, [lab.host_ns(0), lab.host_ns(1)])

    def test_operator_actions_during_streaming_load(self, dep, lab, reference):
        check_actions_during_load(dep, lab.host_ns(0), lab.host_ns(1), reference)

    def test_admin_reads_stay_fast_under_load(self, dep):
        """GET /r2cc/v1/rails is served from a snapshot the poller thread encodes: p99 under 20 ms
        while serving (the issue's figure). The load runs in a child process. On a busy 2-core
        box a normal-priority client itself waits up to ~1 s for a CPU (so does vLLM's own
        /health then), so the figure is asserted from a SCHED_FIFO client, which measures the
        server. A normal client's numbers, raw and net of its own run-queue wait, are printed:
        the net figure still holds other client-side delays (21.8 ms once where the SCHED_FIFO
        client saw 7.2 ms), so it informs but does not gate."""
        with probe.BackgroundLoad(dep.url, dep.model, LOAD.concurrency, LOAD.max_tokens) as load:
            rt = probe.measure(dep.url, 400, realtime=True)
            normal = probe.measure(dep.url, 200)
        _note(f"under load, SCHED_FIFO client: {rt}")
        _note(f"under load, normal client: {normal}")
        _note(f"load: {load.summary}")
        assert load.summary.get("requests", 0) > 0 and load.summary.get("failed") == 0, load.summary
        # The r2cc plugin raised the API server's priority (R2CC_API_SERVER_NICE), every thread.
        tasks = f"/proc/{dep.procs[0].pid}/task"
        assert {os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir(tasks)} == \
            {envs.get("R2CC_API_SERVER_NICE")}
        rails, health = rt["/r2cc/v1/rails"], rt["/health"]
        # When vLLM answers even its own /health about that slowly (some other job loads the
        # box), the admin read must at least not be the slow part.
        assert rails["p99_ms"] < max(20.0, 1.5 * health["p99_ms"] + 5.0), rt


@pytest.mark.slow  # a second deployment (~3 min): with -m vllm or -m slow, not in the default run
class TestTwoNodes:
    """Host labels are node0/node1: each node's workers run inside their lab host already."""

    def test_rails_of_both_nodes_auth_and_worker_metrics(self, dep2):
        check_listing_auth_and_metrics(dep2, ["node0", "node1"])

    def test_operator_actions_during_streaming_load(self, dep2, reference):
        check_actions_during_load(dep2, "node1", "node0", reference)  # act on the remote node first
