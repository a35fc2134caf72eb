"""Operator decisions and the audit trail, through the real admin API (`r2cc admin`, a separate
process) over real 2-rank groups on loopback rails.

A drain with a reason is recorded in R2CC_STATE_DIR; a new group of the same name on the same
hosts comes up with that rail drained (no bytes on it) and the API says why and who; undrain
clears it. Every mutation, allowed or refused, is an audit event, a log line and a count; the
admin token shows nowhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.admin.servers import admin_server, wait_for
from tests.admin.test_admin_api import _r2cc
from tests.comm import workers
from tests.comm.harness import run_ranks, store_barrier
from tests.control.test_decisions import capture_r2cc_logs

TOKEN = "audit-test-secret-7f3a"
FP = hashlib.sha256(TOKEN.encode()).hexdigest()[:8]
GROUP = "keep"
REASON = "swap cable, ticket 42"


def run_until_stopped(rank, world, store, status_dir, state_dir, stop_file, wait_drained):
    """All-reduces (checked bit for bit) until stop_file appears. With wait_drained, first waits
    until this rank sees that rail drained (a drain re-applied by the peer at its start arrives by
    a frame), so no collective runs before every rank knows."""
    import torch

    os.environ.update(R2CC_STATUS_DIR=status_dir, R2CC_STATE_DIR=state_dir)
    lines = capture_r2cc_logs()
    comm = workers.open_comm(rank, world, store, group=GROUP)
    try:
        deadline = time.time() + 10
        while wait_drained is not None and time.time() < deadline and any(
                r["state"] != "drained" for r in comm.rail_stats() if r["rail"] == wait_drained):
            time.sleep(0.01)
        store_barrier(store, "drained-seen", rank, world)
        x = workers.make_input(rank, 1 << 18, torch.float32)
        want = workers.reference_reduce([workers.make_input(r, 1 << 18, torch.float32) for r in range(world)], "sum")
        bad = n = 0
        stop = torch.zeros(1, dtype=torch.int32)
        while True:
            bad += not workers.bits_equal(comm.all_reduce(x.clone()), want)
            n += 1
            if n % 10 == 0:  # rank 0 decides, so every rank runs the same sequence
                stop[0] = int(rank == 0 and os.path.exists(stop_file))
                comm.broadcast(stop, src=0)
                if stop[0]:
                    return {"bad": bad, "n": n, "logs": lines}
            time.sleep(0.002)  # leave the admin server some CPU on a 2-core box
    finally:
        comm.close()


class Group:
    """A running group in a thread of the test; stop() returns every rank's result."""

    def __init__(self, tmp, name: str, status_dir: str, state_dir: str, wait_drained: int | None = None):
        self.stop_file = os.path.join(tmp, f"stop-{name}")
        self.result: dict = {}
        self.thread = threading.Thread(target=lambda: self.result.update(res=run_ranks(
            run_until_stopped, 2, status_dir, state_dir, self.stop_file, wait_drained, timeout=180)))
        self.thread.start()

    def stop(self) -> list[dict]:
        open(self.stop_file, "w").close()
        self.thread.join(timeout=200)
        res = self.result.get("res")
        assert res is not None, "the group did not finish"
        assert all(r["bad"] == 0 and r["n"] > 0 for r in res), [(r["bad"], r["n"]) for r in res]
        return res


@pytest.fixture
def setup(tmp_path):
    status_dir, state_dir = str(tmp_path / "status"), str(tmp_path / "state")
    os.makedirs(status_dir)
    log_path = tmp_path / "admin.log"
    with admin_server(status_dir, TOKEN, log_path) as base:
        yield base, status_dir, state_dir, log_path


def _rails(c, api) -> dict:
    return {(r["host"], r["rail"]): r for r in c.get(api + "/rails").json()["rails"]}


def test_a_drain_with_a_reason_outlives_its_group_and_every_mutation_is_audited(setup, tmp_path):
    base, status_dir, state_dir, log_path = setup
    api, auth = base + "/r2cc/v1", {"Authorization": f"Bearer {TOKEN}"}
    c = httpx.Client(timeout=15)
    state_file = os.path.join(state_dir, f"{GROUP}@rank0.json")

    # ---- the first group: decisions and refusals -------------------------------------------
    first = Group(str(tmp_path), "first", status_dir, state_dir)
    try:
        wait_for(lambda: len(_rails(c, api)) == 6, "both ranks' rails")
        r = c.post(api + "/rails/rank0/1/drain", params={"reason": REASON}, headers=auth)
        assert r.status_code == 200 and r.json()["warnings"] == [], r.text
        doc = json.load(open(state_file))
        assert doc["rails"]["1"]["drain"]["reason"] == REASON and doc["rails"]["1"]["drain"]["by"] == FP, doc
        assert abs(doc["rails"]["1"]["drain"]["at"] - time.time()) < 30
        assert stat.S_IMODE(os.stat(state_file).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(state_dir).st_mode) == 0o700
        shown = c.get(api + "/rails/rank0/1").json()["decisions"]
        assert [(d["action"], d["reason"], d["by"]) for d in shown] == [("drain", REASON, FP)], shown

        assert c.post(api + "/rails/rank0/2/drain").status_code == 401  # no token
        assert c.post(api + "/rails/rank0/2/drain", params={"reason": "two\nlines"}, headers=auth).status_code == 422
        assert c.post(api + "/rails/rank0/0/drain", headers=auth).status_code == 200
        r = c.post(api + "/rails/rank0/2/failover", headers=auth)  # rail 2 is the last healthy one
        assert r.status_code == 409, r.text
        assert c.post(api + "/rails/rank0/0/undrain", headers=auth).status_code == 200
        assert set(json.load(open(state_file))["rails"]) == {"1"}  # rail 0's record is gone, rail 1's kept

        # 403: an admin API with no token configured, on the same agents
        from r2cc_serve.admin import create_app
        from r2cc_serve.admin.sources import StatusDirSource

        with TestClient(create_app(StatusDirSource(status_dir), token=None)) as no_token:
            assert no_token.post("/r2cc/v1/rails/rank0/2/drain", headers=auth).status_code == 403
            forbidden = no_token.get("/r2cc/v1/events", params={"kind": "admin"}).json()["events"]
        assert [(e["result"], e["by"]) for e in forbidden] == [("forbidden", FP)], forbidden

        table = _r2cc("rails", "--url", base)
        assert table.returncode == 0, table.stderr
        assert f"rank0 rail1 drain by {FP} at " in table.stdout and REASON in table.stdout, table.stdout

        audit = [(e["action"], e["host"], e["rail"], e["status"], e["result"], e["by"])
                 for e in c.get(api + "/events", params={"kind": "admin"}).json()["events"]]
        assert audit == [("drain", "rank0", 1, 200, "ok", FP), ("drain", "rank0", 2, 401, "unauthorized", "none"),
                         ("drain", "rank0", 2, 422, "invalid", FP), ("drain", "rank0", 0, 200, "ok", FP),
                         ("failover", "rank0", 2, 409, "conflict", FP), ("undrain", "rank0", 0, 200, "ok", FP)], audit
        events = c.get(api + "/events").json()["events"]  # beside the rails' own events
        assert {e["kind"] for e in events} == {"rail", "admin"}
        admin = [e for e in events if e["kind"] == "admin"]
        assert all(e["client"] == "127.0.0.1" for e in admin), admin
        # the rail's state right after it: "draining" while chunks were still in flight on it
        assert admin[0]["reason"] == REASON and admin[0]["force"] is False and "drain" in admin[0]["detail"], admin
        assert "last healthy rail" in admin[4]["detail"], admin[4]
    finally:
        first.stop()

    # ---- a new group of the same name on the same hosts ------------------------------------
    second = Group(str(tmp_path), "second", status_dir, state_dir, wait_drained=1)
    try:
        def drained_and_busy():
            rails = _rails(c, api)
            ok = (len(rails) == 6 and rails[("rank0", 1)]["state"] == rails[("rank1", 1)]["state"] == "drained"
                  and rails[("rank0", 0)]["bytes_sent"] > 0)
            return rails if ok else None

        rails = wait_for(drained_and_busy, "the new group up with rail 1 drained and moving bytes")
        for host in ("rank0", "rank1"):
            assert rails[(host, 1)]["bytes_sent"] == rails[(host, 1)]["bytes_received"] == 0, rails[(host, 1)]
        assert [(d["action"], d["reason"], d["by"]) for d in rails[("rank0", 1)]["decisions"]] == [
            ("drain", REASON, FP)], rails[("rank0", 1)]
        assert rails[("rank1", 1)]["decisions"] == []  # the decision was about rank0's rail
        health = c.get(api + "/health").json()
        assert any(REASON in reason and FP in reason for reason in health["reasons"]), health

        assert c.post(api + "/rails/rank0/1/undrain", headers=auth).status_code == 200
        assert json.load(open(state_file))["rails"] == {}
        assert c.get(api + "/rails/rank0/1").json()["decisions"] == []
        wait_for(lambda: _rails(c, api)[("rank0", 1)]["bytes_sent"] > 0, "bytes on rail 1 after the undrain")
    finally:
        res = second.stop()
    reapplied = [line for line in res[0]["logs"] if "re-applied rail1 drain" in line]
    assert len(reapplied) == 1 and FP in reapplied[0] and REASON in reapplied[0] and state_file in reapplied[0], \
        res[0]["logs"]
    assert not any("re-applied" in line for line in res[1]["logs"])

    # ---- the counter, and no secret anywhere ------------------------------------------------
    metrics = c.get(base + "/metrics").text
    for action, result, n in (("drain", "ok", 2), ("drain", "unauthorized", 1), ("drain", "invalid", 1),
                              ("failover", "conflict", 1), ("undrain", "ok", 2)):
        assert f'r2cc_admin_mutations_total{{action="{action}",result="{result}"}} {n}.0' in metrics, \
            [line for line in metrics.splitlines() if "mutations" in line]
    server_log = log_path.read_text()
    assert server_log.count("r2cc admin audit:") == 7 and f"by={FP} from=127.0.0.1 -> 409 conflict" in server_log, \
        server_log
    everything = [metrics, server_log, json.dumps(c.get(api + "/events", params={"limit": 1000}).json()),
                  open(state_file).read(), json.dumps([r["logs"] for r in res])]
    assert not any(TOKEN in text for text in everything)
