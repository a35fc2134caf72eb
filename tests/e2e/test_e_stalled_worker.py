"""A stopped TP worker is not a dead network (vLLM, TP=2 over lab rails, r2cc backend).

`kill -STOP` of the rank-1 worker while requests stream, then `kill -CONT`: no request
fails, the tokens equal the fault-free reference, no rail is failed over, and rank 0
reports rank 1 as stalled while it lasts. Also the same stop while idle: the server stays
healthy and serves afterwards. (Longer stops: -m slow.) The shared r2cc_single deployment of
conftest.py."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time

import httpx
import pytest

from r2cc_testbed.serving import evidence
from r2cc_testbed.serving.load import compare, run_load
from tests.e2e.conftest import LOAD

USES_SHARED_DEPLOYMENT = True


@pytest.fixture(scope="module")
def dep(r2cc_single):
    return r2cc_single


def _worker_pid(dep, rank: int) -> int:
    for doc in evidence.read_status(dep.status_dir).values():
        if doc.get("rank") == rank and (doc.get("process") or {}).get("pid"):
            return int(doc["process"]["pid"])
    raise AssertionError(f"no status file of rank {rank} in {dep.status_dir}")


def _stop(pid: int, seconds: float) -> None:
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


def _stall_events(dep) -> list[dict]:
    return [e for doc in evidence.read_status(dep.status_dir).values() for e in doc.get("events", [])
            if e.get("kind") == "peer"]


def _stopped_while_streaming(dep, reference, stop_s: float) -> None:
    pid = _worker_pid(dep, 1)
    before = evidence.rail_totals(evidence.read_status_now(dep.status_dir))
    stalls_before = len(_stall_events(dep))
    spec = dataclasses.replace(LOAD, duration_s=stop_s + 8, deadline_s=stop_s + 300)
    out = {}
    loader = threading.Thread(target=lambda: out.update(run=run_load(dep.url, dep.model, spec)))
    loader.start()
    time.sleep(3)  # requests in flight
    t_stop = time.time()
    _stop(pid, stop_s)
    t_cont = time.time()
    loader.join(timeout=stop_s + 320)
    run = out["run"]
    assert not run.failed, run.summary()
    # The stop really held generation up (the right process was stopped): no token came out
    # during it, and the streams resumed after it.
    inside = [t for r in run.results for t in r.gap_times if t_stop + 0.3 < t < t_cont - 0.1]
    assert not inside, f"{len(inside)} tokens streamed while rank 1 was stopped"
    times = [t for r in run.results for t in r.gap_times]
    assert any(t < t_stop for t in times) and any(t > t_cont for t in times), run.summary()
    assert compare(reference, run) == []
    after = evidence.read_status_now(dep.status_dir)
    delta = evidence.diff_totals(before, evidence.rail_totals(after))
    assert all(t["failovers"] == 0 and t["chunks_resent"] == 0 for t in delta.values()), \
        (delta, evidence.rail_errors(after))
    stalls = _stall_events(dep)[stalls_before:]
    assert any(e["to"] == "stalled" and e["peer"] == 1 for e in stalls), stalls
    assert any(e["to"] == "running" and e["peer"] == 1 and (e["detect_s"] or 0) > stop_s * 0.7 for e in stalls), stalls
    print(f"stop {stop_s:.0f} s: {run.summary()}")


def test_worker_stopped_3s_while_streaming(dep, reference):
    _stopped_while_streaming(dep, reference, 3.0)


def test_worker_stopped_3s_while_idle_keeps_serving(dep, reference):
    _stop(_worker_pid(dep, 1), 3.0)
    health = httpx.get(dep.url + "/r2cc/v1/health", timeout=10).json()
    assert health["status"] in ("ok", "degraded"), health  # degraded only while the stall is still reported
    assert httpx.get(dep.url + "/health", timeout=10).status_code == 200
    run = run_load(dep.url, dep.model, LOAD)
    assert not run.failed and compare(reference, run) == [], run.summary()


@pytest.mark.slow
@pytest.mark.parametrize("stop_s", [10.0, 30.0])
def test_worker_stopped_long_while_streaming(dep, reference, stop_s):
    _stopped_while_streaming(dep, reference, stop_s)
