"""The per-rank control agent and status file, over real HTTP on loopback."""

import json
import os

from r2cc_serve import envs
from tests.comm import workers
from tests.comm.harness import run_ranks, store_barrier


def agent_roundtrip(rank, world, store, status_dir):
    import time

    import httpx
    import torch

    os.environ["R2CC_STATUS_DIR"] = status_dir
    comm = workers.open_comm(rank, world, store)
    try:
        x = workers.make_input(rank, 1 << 18, torch.float32)
        comm.all_reduce(x.clone())
        path = os.path.join(status_dir, f"test-rank{rank}.json")
        deadline = time.time() + 5
        while not os.path.exists(path) and time.time() < deadline:
            time.sleep(0.05)
        status = json.load(open(path))
        mode = oct(os.stat(path).st_mode & 0o777)
        url, auth = f"http://{status['agent_address']}", {"Authorization": f"Bearer {status['agent_token']}"}
        out = {"mode": mode, "status": status["status"],
               "no_token": httpx.get(url + "/state", timeout=5).status_code,
               "bad_rail": httpx.post(url + "/rails/9/drain", headers=auth, timeout=5).status_code}
        if rank == 0:
            out["drain"] = httpx.post(url + "/rails/1/drain", headers=auth, timeout=5).json()
            time.sleep(0.3)
            state = httpx.get(url + "/state", headers=auth, timeout=5).json()
            out["after_drain"] = state["status"], [r["state"] for r in state["rails"] if r["rail"] == 1]
            out["events"] = [(e["from"], e["to"]) for e in state["events"]]
            out["token_leaked"] = "agent_token" in state
            # Kept-alive reads, as the admin view polls: no answer may sit out the client's delayed
            # ACK (Nagle held the body back 40 ms per answer before TCP_NODELAY).
            with httpx.Client(headers=auth, timeout=5, trust_env=False) as client:
                lat = []
                for _ in range(21):
                    t0 = time.perf_counter()
                    assert client.get(url + "/state").status_code == 200
                    lat.append(time.perf_counter() - t0)
            out["keepalive_median_s"] = sorted(lat)[10]
            out["control_nice"] = [os.getpriority(os.PRIO_PROCESS, t.native_id)
                                   for t in (comm.agent._thread, comm.monitor._thread)]
        store_barrier(store, "checked", rank, world)
        return out
    finally:
        comm.close()


def test_agent_serves_state_and_drains_with_token(tmp_path):
    res = run_ranks(agent_roundtrip, 2, str(tmp_path), timeout=60)
    for r in res:
        assert r["mode"] == "0o600" and r["status"] == "ok", r
        assert r["no_token"] == 401 and r["bad_rail"] == 404, r
    r0 = res[0]
    assert r0["drain"]["done"] and r0["after_drain"] == ("degraded", ["drained"]), r0
    assert ("up", "drained") in r0["events"] and not r0["token_leaked"], r0
    assert r0["keepalive_median_s"] < 0.020, r0  # a delayed-ACK stall is >= 40 ms
    if os.geteuid() == 0:  # agent and monitor answer before the model's threads (R2CC_CONTROL_NICE)
        assert r0["control_nice"] == [envs.get("R2CC_CONTROL_NICE")] * 2, r0
    assert not list(tmp_path.iterdir())  # status files removed on close
