"""The standalone admin API as a real server process over a real 2-rank group (loopback rails)."""

import json
import os
import statistics
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.comm import workers
from tests.comm.harness import free_port, run_ranks

TOKEN = "test-admin-token"


def _r2cc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "r2cc_serve.cli", *args], capture_output=True, text=True,
                          timeout=60)


def test_r2cc_rails_names_what_is_wrong_when_the_url_is_no_admin_api(stub_server):
    """Nothing listening, and a server without the r2cc API (vLLM on its default backend
    answers 404 JSON): a one-line error and exit code 2, never a traceback."""
    for url, says in ((stub_server + "/not-r2cc", "HTTP 404"), (f"http://127.0.0.1:{free_port()}", "cannot reach")):
        out = _r2cc("rails", "--url", url)
        assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_r2cc_rails_without_url_finds_the_local_api_or_says_how(stub_server):
    """Without --url `r2cc rails` asks this host's `r2cc admin` port, then vLLM's default port,
    and takes the first that answers as r2cc's admin API; none: one line naming both and --url."""
    from r2cc_serve.admin.client import find_local_api
    from r2cc_serve.errors import UserError

    dead = f"http://127.0.0.1:{free_port()}"
    with httpx.Client(trust_env=False) as client:
        assert find_local_api(client, (dead, stub_server + "/not-r2cc", stub_server)) == stub_server
        with pytest.raises(UserError, match="--url"):
            find_local_api(client, (dead, stub_server + "/not-r2cc"))
    out = _r2cc("rails")  # nothing of ours on 8470 or 8000 here (a vLLM on 8000 would be found)
    assert out.returncode in (0, 1, 2) and "Traceback" not in out.stderr, out.stderr
    if out.returncode == 2:
        assert "8470" in out.stderr and "8000" in out.stderr and "--url" in out.stderr, out.stderr


def busy_group(rank, world, store, status_dir):
    """All-reduces (checked bit for bit) until a stop file appears; rank 0 decides when,
    and tells the others through the group itself, so every rank runs the same sequence."""
    import torch

    os.environ["R2CC_STATUS_DIR"] = status_dir
    # The planned path (C++ plan executor) under the admin API's actions. Two ranks plan only
    # with a fixed table: with measured ones auto keeps the built-in path, which nothing beats.
    os.environ["R2CC_SCHEDULE"] = "auto"
    os.environ["R2CC_BANDWIDTH_TABLE"] = "1,0.5"
    comm = workers.open_comm(rank, world, store, group="adm")
    try:
        x = workers.make_input(rank, 1 << 18, torch.float32)
        want = workers.reference_reduce([workers.make_input(r, 1 << 18, torch.float32) for r in range(world)], "sum")
        bad = n = 0
        stop = torch.zeros(1, dtype=torch.int32)
        while True:
            if not workers.bits_equal(comm.all_reduce(x.clone()), want):
                bad += 1
            n += 1
            if n % 10 == 0:
                stop[0] = int(rank == 0 and os.path.exists(os.path.join(status_dir, "..", "stop")))
                comm.broadcast(stop, src=0)
                if stop[0]:
                    return {"bad": bad, "n": n}
    finally:
        comm.close()


@pytest.fixture
def admin(tmp_path):
    status_dir = str(tmp_path / "status")
    os.makedirs(status_dir)
    port = free_port()
    env = dict(os.environ, R2CC_ADMIN_TOKEN=TOKEN)
    result = {}
    group = threading.Thread(target=lambda: result.update(res=run_ranks(busy_group, 2, status_dir, timeout=180)))
    group.start()
    deadline = time.time() + 60
    while len(os.listdir(status_dir)) < 2 and time.time() < deadline:
        time.sleep(0.1)
    server = subprocess.Popen([sys.executable, "-m", "r2cc_serve.cli", "admin", "--port", str(port),
                               "--status-dir", status_dir], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                if httpx.get(base + "/r2cc/v1/health", timeout=1).status_code in (200, 503):
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield base, result, group
    finally:
        open(os.path.join(status_dir, "..", "stop"), "w").close()
        server.terminate()
        server.wait(timeout=10)
        group.join(timeout=200)
        res = result.get("res")
        assert res is not None, "the group did not finish"
        assert all(r["bad"] == 0 and r["n"] > 0 for r in res), res  # nothing lost, all exact


def _rail_states_once(client, api, ok, since, within=1.0):
    """{(host, rail): state} from GET /rails, polled until ok(states) or `within` seconds after
    `since` (the caller asserts on what comes back)."""
    while True:
        states = {(x["host"], x["rail"]): x["state"] for x in client.get(api + "/rails").json()["rails"]}
        if ok(states) or time.time() - since >= within:
            return states
        time.sleep(0.02)


def test_admin_rails_actions_errors_metrics(admin):
    base, result, group = admin
    api, auth = base + "/r2cc/v1", {"Authorization": f"Bearer {TOKEN}"}
    # One kept-alive client, as a dashboard would poll (a new client per call costs ~80 ms of CPU).
    c = httpx.Client(timeout=5)
    # The group's first status files come before every rail has finished its handshake (on a
    # busy box a rail was still coming up when the server first answered): wait for them, then
    # check that coming up cost no failover.
    _rail_states_once(c, api, lambda st: all(v == "up" for v in st.values()), time.time(), within=20)
    rails = c.get(api + "/rails").json()["rails"]
    brief = [(r["host"], r["rail"], r["state"], r.get("failovers"), r.get("last_error")) for r in rails]
    assert sorted({r["host"] for r in rails}) == ["rank0", "rank1"] and len(rails) == 6, brief
    assert all(r["state"] == "up" and r.get("failovers") == 0 for r in rails), brief
    assert c.get(api + "/health").json()["status"] == "ok"  # no fault: no false "degraded"

    # errors: auth, unknown host/rail, malformed
    assert c.post(api + "/rails/rank0/1/drain").status_code == 401
    assert c.post(api + "/rails/rank0/1/drain", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert c.get(api + "/rails/nohost/0").status_code == 404
    assert c.get(api + "/rails/rank0/7").status_code == 404
    assert c.get(api + "/rails/rank0/abc").status_code == 422
    assert c.post(api + "/rails/rank0/1/drain?force=maybe", headers=auth).status_code == 422

    # drain: effective on both ranks within 1 s, visible through GET
    t0 = time.time()
    r = c.post(api + "/rails/rank0/1/drain", headers=auth)
    assert r.status_code == 200 and r.json()["ranks"] == [0], r.text
    states = _rail_states_once(c, api, lambda st: st[("rank0", 1)] == st[("rank1", 1)] == "drained", t0)
    assert states[("rank0", 1)] == "drained" and states[("rank1", 1)] == "drained", states
    health = c.get(api + "/health").json()
    assert health["status"] == "degraded" and any("rail1" in x for x in health["reasons"]), health

    # the last healthy rail of a host is protected
    assert c.post(api + "/rails/rank0/0/drain", headers=auth).status_code == 200
    r = c.post(api + "/rails/rank0/2/failover", headers=auth)
    assert r.status_code == 409 and "last healthy rail" in r.json()["detail"], r.text
    for k in (0, 1):
        assert c.post(api + f"/rails/rank0/{k}/undrain", headers=auth).status_code == 200
    # undrain reaches the peer by a frame, like drain: effective on both ranks within 1 s
    both_up = lambda st: all(st[(h, k)] == "up" for h in ("rank0", "rank1") for k in (0, 1))  # noqa: E731
    states = _rail_states_once(c, api, both_up, time.time())
    assert both_up(states), states

    # failover + restore
    assert c.post(api + "/rails/rank1/2/failover", headers=auth).status_code == 200
    assert c.get(api + "/rails/rank1/2").json()["state"] == "down"
    assert c.post(api + "/rails/rank1/2/restore", headers=auth).status_code == 200
    deadline = time.time() + 10
    while time.time() < deadline and c.get(api + "/rails/rank1/2").json()["state"] != "up":
        time.sleep(0.1)
    assert c.get(api + "/rails/rank1/2").json()["failovers"] >= 1

    events = c.get(api + "/events", params={"kind": "rail"}).json()["events"]
    kinds = {(e["host"], e["rail"], e["from"], e["to"]) for e in events}
    assert ("rank0", 1, "up", "drained") in kinds or ("rank0", 1, "up", "draining") in kinds, kinds

    text = c.get(base + "/metrics").text
    assert 'r2cc_rail_up{host="rank0",rail="0"} 1.0' in text, text[:2000]
    sent = [float(l.split()[-1]) for l in text.splitlines() if l.startswith('r2cc_rail_sent_bytes_total{host="rank0"')]
    assert sent and sum(sent) > 0
    assert "r2cc_rail_failovers_total" in text and "r2cc_collective_duration_seconds_bucket" in text
    chunk = [float(l.split()[-1]) for l in text.splitlines() if l.startswith('r2cc_peer_chunk_bytes{host="rank0"')]
    assert chunk and chunk[0] >= 16 << 10, text[:2000]  # what rank0 cuts its messages to rank1 into
    # what alert rules and the dashboard join on (configs/prometheus, configs/grafana)
    for line in ('r2cc_host_rails{host="rank0"} 3.0', 'r2cc_host_rails_up{host="rank1"} 3.0',
                 "r2cc_admin_token_configured 1.0"):
        assert line in text, (line, '|'.join(x for x in text.splitlines() if x.startswith(('r2cc_host', 'r2cc_rail_fallback', 'r2cc_admin'))))
    assert 'r2cc_plan_schedule{group=' in text
    # how each rank's waits went (R2CC_SPIN_US is on by default): every one spun or was skipped
    for host in ("rank0", "rank1"):
        waits = [float(l.split()[-1]) for l in text.splitlines() if l.startswith(f'r2cc_spin_waits_total{{host="{host}"')]
        assert len(waits) == 3 and sum(waits) > 0, [l for l in text.splitlines() if l.startswith("r2cc_spin")]
    assert 'r2cc_host_cpu_pressure{host="rank0"}' in text

    # `r2cc rails`: the same view in the terminal, as a client of this server
    table = _r2cc("rails", "--url", base)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:4] == ["HOST", "RAIL", "IFACE", "STATE"], lines[0]
    rows = [l.split() for l in lines[1:] if l.startswith("rank")]
    assert sorted((r[0], r[1]) for r in rows) == [(h, str(k)) for h in ("rank0", "rank1") for k in range(3)], rows
    assert "health:" in table.stdout
    doc = json.loads(_r2cc("rails", "--url", base, "--json").stdout)
    assert {(r["host"], r["rail"]) for r in doc["rails"]} == {(h, k) for h in ("rank0", "rank1") for k in range(3)}
    assert doc["health"]["status"] in ("ok", "degraded")

    # GET /plan and `r2cc rails`: the planner's schedule, table and decisions, the same on both ranks
    deadline = time.time() + 10
    while True:
        plans = c.get(api + "/plan").json()["groups"]
        if (plans and plans[0]["agreed"] and plans[0]["choices"]) or time.time() > deadline:
            break
        time.sleep(0.1)
    assert [g["group"] for g in plans] == ["adm"] and plans[0]["schedule"] == "auto" and plans[0]["agreed"], plans
    assert [r["host"] for r in plans[0]["ranks"]] == ["rank0", "rank1"], plans
    assert all(r["epoch"] >= 1 for r in plans[0]["ranks"]), plans
    bw = [r["bandwidth_Bps"] for r in plans[0]["ranks"]]
    assert bw[1] == pytest.approx(bw[0] / 2) and bw[0] > 0, plans  # the table, scaled to the rails
    assert {c_["size_bucket_bytes"] for c_ in plans[0]["choices"]} == {1 << 20}, plans  # the group's 1 MiB calls
    assert "plan adm: auto, table" in table.stdout and "1.0MiB->" in table.stdout, table.stdout

    # GET /rails latency while the group is busy (reported, not asserted)
    lat = []
    for _ in range(200):
        t = time.perf_counter()
        c.get(api + "/rails")
        lat.append(time.perf_counter() - t)
    lat.sort()
    print(f"GET /rails p50 {statistics.median(lat) * 1e3:.2f} ms p99 {lat[197] * 1e3:.2f} ms")


def test_concurrent_failovers_never_take_a_hosts_last_rail(admin):
    """Every rail of a host failed over at once, without force, 50 times: the last-healthy-rail
    check and the action are one step, so at least one POST is refused each round."""
    import concurrent.futures

    base, result, group = admin
    api, auth = base + "/r2cc/v1", {"Authorization": f"Bearer {TOKEN}"}
    c = httpx.Client(timeout=15)
    rails = [r["rail"] for r in c.get(api + "/rails").json()["rails"] if r["host"] == "rank0"]
    worst = 0
    with concurrent.futures.ThreadPoolExecutor(len(rails)) as pool:
        for _ in range(50):
            codes = list(pool.map(lambda k: httpx.post(f"{api}/rails/rank0/{k}/failover", headers=auth,
                                                       timeout=15).status_code, rails))
            assert set(codes) <= {200, 409}, codes
            worst = max(worst, codes.count(200))
            for k in rails:
                assert c.post(f"{api}/rails/rank0/{k}/restore", headers=auth).status_code == 200
            deadline = time.time() + 10
            while time.time() < deadline and any(r["state"] != "up" for r in c.get(api + "/rails").json()["rails"]):
                time.sleep(0.05)
    assert 1 <= worst <= len(rails) - 1, worst
    assert c.get(api + "/health").json()["status"] == "ok"


def test_validation_errors_are_422_inside_an_app_that_says_400():
    """vLLM's API server answers validation errors with 400 app-wide; the r2cc routes keep 422."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from fastapi.testclient import TestClient

    from r2cc_serve.admin.app import AdminState, build_router

    app = FastAPI()

    @app.exception_handler(RequestValidationError)
    async def as_400(request: Request, exc: RequestValidationError):
        return JSONResponse(status_code=400, content={"error": "bad request"})

    app.include_router(build_router(AdminState()))
    client = TestClient(app)
    assert client.get("/r2cc/v1/rails/h0/abc").status_code == 422
    assert client.get("/r2cc/v1/events?limit=0").status_code == 422
