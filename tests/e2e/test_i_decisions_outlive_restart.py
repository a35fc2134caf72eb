"""An operator's drain outlives a vLLM restart (issue 30's figure): real vLLM, real admin API.

vLLM with r2cc and R2CC_STATE_DIR; the operator drains node0's rail 1 with a reason through
vLLM's own port; vLLM is stopped and started again on the same state folder. The new process
comes up with that rail drained, says who drained it, when and why (GET /r2cc/v1/rails and
`r2cc rails`), carries no byte on it under load, and undrain clears the record. Every mutation
of each process is in its /events. Two deployments: ~4 minutes, so slow (not in the default run:
`python3 -m pytest -q -m slow tests/e2e/test_i_decisions_outlive_restart.py`).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from r2cc_testbed.serving.deploy import single_instance
from r2cc_testbed.serving.load import LoadSpec, run_load
from tests.comm.harness import free_port
from tests.e2e.conftest import SERVE_ARGS

TOKEN = "e2e-restart-token"
BY = hashlib.sha256(TOKEN.encode()).hexdigest()[:8]
REASON = "optic swap, ticket 4711"
RAIL = 1
LOAD = LoadSpec(max_tokens=16, concurrency=4, request_timeout_s=240, deadline_s=300)


def _note(msg: str) -> None:
    print(f"[restart-e2e] {msg}", file=sys.stderr, flush=True)


def _rail(http: httpx.Client, host: str, rail: int) -> dict:
    r = http.get("/r2cc/v1/rails")
    assert r.status_code == 200, f"GET /r2cc/v1/rails: HTTP {r.status_code} {r.text[:300]}"
    return next(x for x in r.json()["rails"] if x["host"] == host and x["rail"] == rail)


def _rails_sampled_after(http: httpx.Client, host: str, t: float, timeout_s: float) -> dict[int, dict]:
    """host's rails, from one GET /rails whose numbers its ranks sampled after t (unix time). A
    rank samples its counters once per R2CC_STATUS_REFRESH_MS (1 s), so a read right after a load
    shorter than that can show the bytes from before it (issue 48)."""
    deadline = time.time() + timeout_s
    while True:
        r = http.get("/r2cc/v1/rails")
        assert r.status_code == 200, f"GET /r2cc/v1/rails: HTTP {r.status_code} {r.text[:300]}"
        rails = {x["rail"]: x for x in r.json()["rails"] if x["host"] == host}
        sampled = {k: (x["sampled_at"], x["stale"]) for k, x in sorted(rails.items())}
        if rails and all(at is not None and at > t for at, _ in sampled.values()):
            return rails
        if time.time() > deadline:
            raise AssertionError(f"no view of {host}'s rails sampled after {t:.3f} within {timeout_s} s "
                                 f"(rail: (sampled_at, stale) {sampled}, view updated {r.json()['updated']:.3f})")
        time.sleep(0.1)


def _wait_state(http: httpx.Client, host: str, rail: int, state: str, timeout_s: float) -> dict:
    deadline = time.time() + timeout_s
    while True:
        x = _rail(http, host, rail)
        if x["state"] == state:
            return x
        if time.time() > deadline:
            raise AssertionError(f"{host} rail{rail} is {x['state']} after {timeout_s} s, want {state}: {x}")
        time.sleep(0.1)


def _admin_events(http: httpx.Client) -> list[dict]:
    r = http.get("/r2cc/v1/events", params={"kind": "admin"})
    assert r.status_code == 200, f"GET /r2cc/v1/events: HTTP {r.status_code}"
    return r.json()["events"]


@pytest.mark.slow
def test_a_drain_with_a_reason_outlives_a_vllm_restart(lab, model_dir, session, tmp_path):
    state_dir = str(tmp_path / "state")
    env = {"R2CC_ADMIN_TOKEN": TOKEN, "R2CC_STATE_DIR": state_dir}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    port = free_port()
    host = lab.host_ns(0)  # a single instance's hosts are named after the lab hosts its ranks run in

    with single_instance(lab, model_dir, backend="r2cc", port=port, extra_args=SERVE_ARGS, extra_env=env) as dep:
        session.deployments.append(dep)
        http = httpx.Client(base_url=dep.url, timeout=10.0, trust_env=False)
        t_drain = time.time()
        r = http.post(f"/r2cc/v1/rails/{host}/{RAIL}/drain", params={"reason": REASON}, headers=auth)
        assert r.status_code == 200, r.text[:300]
        _wait_state(http, host, RAIL, "drained", 5.0)
        first_events = _admin_events(http)
        files = [f for f in os.listdir(state_dir) if f.endswith(".json")]  # (beside a lock file)
        assert files and all(json.load(open(os.path.join(state_dir, f))) for f in files), files
    _note(f"first process stopped; state files {files}")

    t_start = time.time()
    with single_instance(lab, model_dir, backend="r2cc", port=port, extra_args=SERVE_ARGS, extra_env=env) as dep:
        session.deployments.append(dep)
        _note(f"restarted in {time.time() - t_start:.1f} s")
        http = httpx.Client(base_url=dep.url, timeout=10.0, trust_env=False)
        # The rail is drained from the first moment, without anyone asking again.
        x = _wait_state(http, host, RAIL, "drained", 5.0)
        (d,) = [d for d in x["decisions"] if d["action"] == "drain"]
        assert d["reason"] == REASON and d["by"] == BY and abs(d["at"] - t_drain) < 5, d
        cli = subprocess.run([sys.executable, "-m", "r2cc_serve.cli", "rails", "--url", dep.url],
                             capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0, cli.stderr
        assert f"rail{RAIL} drain by {BY}" in cli.stdout and REASON in cli.stdout, cli.stdout
        before = _rails_sampled_after(http, host, 0.0, 5.0)
        sent0, others0 = before[RAIL]["bytes_sent"], sum(before[k]["bytes_sent"] for k in (0, 2, 3))
        load_t0 = time.time()
        load = run_load(dep.url, dep.model, LOAD)
        assert load.results and not load.failed, [r.error for r in load.failed][:3]
        # The load may be shorter than the ranks' sampling period: read counters sampled after it.
        t_end = time.time()
        rails = _rails_sampled_after(http, host, t_end, 15.0)
        after = rails[RAIL]
        others = sum(rails[k]["bytes_sent"] for k in (0, 2, 3)) - others0
        _note(f"under load: rail{RAIL} +{after['bytes_sent'] - sent0} B, rails 0/2/3 +{others} B, "
              f"{len(load.ok)} requests ok; load {t_end - load_t0:.2f} s, a sample after it "
              f"{time.time() - t_end:.2f} s later")
        assert after["state"] == "drained" and after["bytes_sent"] == sent0 and others > 0, after
        # Undrain clears the record: the rail carries traffic again and the file forgets it.
        r = http.post(f"/r2cc/v1/rails/{host}/{RAIL}/undrain", params={"reason": "optic replaced"}, headers=auth)
        assert r.status_code == 200, r.text[:300]
        x = _wait_state(http, host, RAIL, "up", 20.0)
        assert not x["decisions"], x
        second_events = _admin_events(http)
    # Each process's audit has its own mutations (who by fingerprint, never the token).
    for events, actions in ((first_events, {"drain"}), (second_events, {"undrain"})):
        text = json.dumps(events)
        assert TOKEN not in text
        assert actions <= {e.get("action") for e in events}, events
        assert all(e.get("by") == BY and e.get("result") == "ok" for e in events if e.get("action") in actions), events
    left = {f: json.load(open(os.path.join(state_dir, f))) for f in os.listdir(state_dir) if f.endswith(".json")}
    assert not any("drain" in json.dumps(v) for v in left.values()), left
