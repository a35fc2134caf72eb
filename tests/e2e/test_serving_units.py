"""Pure parts of r2cc_testbed.serving, fast and without vLLM: SSE parsing, timing, comparison, log parsing."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from r2cc_testbed.faults.model import FaultSpec
from r2cc_testbed.serving import evidence, fault_experiment
from r2cc_testbed.serving.fault_experiment import FaultRecord
from r2cc_testbed.serving.load import LoadSpec, compare, percentile, run_load

NEEDS = "nothing"


class _FakeCompletions(BaseHTTPRequestHandler):
    """/v1/completions that streams max_tokens ids (prompt length + i), two per chunk after the first."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body["prompt"] == "fail":
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b'{"error": "engine dead"}')
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        ids = [len(body["prompt"]) + i for i in range(body["max_tokens"])]
        chunks = [ids[:1]] + [ids[i:i + 2] for i in range(1, len(ids), 2)]
        for n, chunk in enumerate(chunks):
            time.sleep(0.01)
            finish = "length" if n == len(chunks) - 1 else None
            msg = {"choices": [{"index": 0, "text": "x" * len(chunk), "token_ids": chunk, "finish_reason": finish}]}
            self.wfile.write(f"data: {json.dumps(msg)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def fake_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeCompletions)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_stream_is_parsed_into_token_ids_and_gaps(fake_url):
    spec = LoadSpec(prompts=["ab", "abcd", "fail"], max_tokens=5, concurrency=2, deadline_s=30)
    res = run_load(fake_url, "m", spec)
    ok, failed = res.ok, res.failed
    assert [r.token_ids for r in ok] == [[2, 3, 4, 5, 6], [4, 5, 6, 7, 8]]
    assert [r.text for r in ok] == ["xxxxx"] * 2
    assert all(len(r.gaps_s) == 4 and r.ttft_s > 0 and r.tpot_s > 0 for r in ok)  # one gap per token after the first
    assert len(failed) == 1 and failed[0].error.startswith("HTTP 500")
    s = res.summary()
    assert (s["requests"], s["ok"], s["failed"], s["tokens"]) == (3, 2, 1, 10)


def test_duration_mode_cycles_prompts_and_compare_matches_by_prompt(fake_url):
    ref = run_load(fake_url, "m", LoadSpec(prompts=["a", "bb"], max_tokens=3, concurrency=1))
    run = run_load(fake_url, "m", LoadSpec(prompts=["a", "bb"], max_tokens=3, concurrency=2, duration_s=0.3))
    assert len(run.results) > 2 and not run.failed
    assert compare(ref, run) == []
    run.ok[0].token_ids = [9, 9, 9]
    assert "differ from position 0" in compare(ref, run)[0]


def test_one_percentile_interpolates_like_numpy_and_vllm():
    import numpy as np

    from r2cc_testbed.loadtest import intervals as stats
    from r2cc_testbed.serving import admin_latency as probe

    assert percentile is stats.percentile  # one helper for the serving tools and the load tests
    assert percentile([], 50) is None and percentile([None], 99) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    for xs in ([float(i) for i in range(1, 101)], [1.0, 5.0], [0.3, 0.1, 0.7, 0.2]):
        for p in (50, 90, 99):
            assert percentile(xs, p) == pytest.approx(np.percentile(xs, p), rel=1e-12)
    assert probe.percentiles([0.001, 0.003])["p50_ms"] == 2.0


def test_log_watcher_stamps_rail_transitions(tmp_path):
    log = tmp_path / "node0.log"
    log.write_text("old line before the watch\nr2cc: tp:0 rank 0 rail1 to rank 1: up -> down (old)\n")
    with evidence.LogWatcher([str(log)], interval_s=0.01) as w:
        with open(log, "a") as f:
            f.write("(Worker_TP0 pid=1) r2cc: tp:0 rank 0 rail2 to rank 1: up -> down "
                    "(no bytes from rank 1 on rail2 for 61 ms (link down or blackholed))\n")
            f.write("r2cc: tp:0 rank 1 rail2 to rank 0: down -> up\nINFO unrelated\n")
        time.sleep(0.1)
    t = w.transitions
    assert [(x.rank, x.rail, x.old, x.new) for x in t] == [(0, 2, "up", "down"), (1, 2, "down", "up")]
    assert t[0].reason.startswith("no bytes from rank 1 on rail2")


def test_status_events_become_transitions():
    status = {"tp_0-rank0.json": {"rails": [{"rail": 1, "bytes_sent": 10, "failovers": 1, "fallback": False}],
                                  "events": [{"time": 5.0, "group": "tp:0", "rank": 0, "peer": 1, "rail": 1,
                                              "from": "up", "to": "down", "error": "x", "detect_s": 0.06},
                                             {"bogus": True}]}}
    (t,) = evidence.status_transitions(status)
    assert (t.rail, t.old, t.new, t.detect_s) == (1, "up", "down", 0.06)
    assert evidence.rail_totals(status)[1]["failovers"] == 1


class _Watcher:
    """Stands in for LogWatcher: the transitions a test appends."""

    def __init__(self, transitions):
        self.transitions = transitions

    def between(self, start=None, end=None):
        return list(self.transitions)


def _rail3(t, old, new):
    return evidence.Transition(t, "log", "tp:0", 0, 3, 1, old, new, "")


@pytest.mark.parametrize("held", [True, False])
def test_recovery_wait_follows_a_flap_hold_and_only_a_hold(tmp_path, monkeypatch, held):
    """A rail held out by flap dampening past the plain wait still counts as recovered when it
    returns as its hold ends; a rail not held gets the plain wait and no more."""
    monkeypatch.setattr(fault_experiment, "RECOVER_WAIT_S", 0.3)
    monkeypatch.setattr(fault_experiment, "RECOVER_HELD_MAX_S", 10.0)
    now = time.time()
    rail = {"rail": 3, "state": "held" if held else "down", "hold_left_s": 1.0 if held else 0.0,
            "hold_reason": "flapping" if held else "", "holds": 1, "loss_holds": 0, "flap_failures": 8}
    (tmp_path / "tp_0-rank0.json").write_text(json.dumps({"rank": 0, "rails": [rail]}))
    transitions = [_rail3(now - 1, "up", "down"), _rail3(now - 0.5, "down", "held" if held else "down")]
    comes_back = threading.Timer(1.2, lambda: transitions.append(_rail3(time.time(), "held", "up")))
    comes_back.start()
    rec = FaultRecord(FaultSpec("flap", host=0, rail=3), inject_started_at=now - 2, injected_at=now - 2,
                      restored_at=now)
    recovered, took, last = fault_experiment._wait_recovered(_Watcher(transitions), [3], rec, str(tmp_path))
    waited = time.time() - now
    comes_back.join()
    assert recovered is held
    if held:
        assert 1.0 <= took < 3.0
    else:
        assert waited < 1.0  # gave up at the plain wait, did not wait for the rail
        why = fault_experiment._unrecovered(last, evidence.read_status(str(tmp_path)), [3])
        assert "down" in why["rank0 rail3 last logged"] and "failures 8" in why["rank0 rail3 status file"]


def test_spin_waits_sum_the_workers_and_keep_the_highest_pressure():
    def doc(hits, misses, skips, pressure, briefs=0):
        return {"counters": {"spin_hits": hits, "spin_misses": misses, "spin_skips": skips, "spin_briefs": briefs,
                             "cpu_pressure": pressure}}

    from r2cc_serve.health.monitor import spin_waits

    older_build = {"counters": {"spin_hits": 1, "spin_misses": 0, "spin_skips": 0, "cpu_pressure": 0.1}}
    status = {"a.json": doc(5, 1, 100, 0.4, briefs=3), "b.json": doc(2, 0, 50, 0.7), "old.json": {"counters": {}},
              "older.json": older_build}
    assert spin_waits(status.values()) == {"spin_hits": 8, "spin_misses": 1, "spin_skips": 150, "spin_briefs": 3,
                                           "cpu_pressure": 0.7}
    assert spin_waits([{"rails": []}]) == {}
    from r2cc_testbed.serving.serve_bench import _spin_text

    text = _spin_text({"spin_hits": 7, "spin_misses": 1, "spin_skips": 150, "spin_briefs": 3,
                       "cpu_pressure_last": 0.7})
    assert "spun 8 (7 got their bytes), 3 of them only briefly" in text, text
    assert "slept at once 150 (CPU pressure 0.70)" in text, text


def test_prefill_bench_reads_the_planned_schedule_and_renders():
    from r2cc_testbed.serving import serve_prefill as bench_prefill

    status = {"g-rank0.json": {"plan": {"schedule": "auto", "choices": [
        {"size_bucket_bytes": 1 << 20, "schedule": "direct", "chunks": 1},
        {"size_bucket_bytes": 2 << 20, "schedule": "optcc", "chunks": 13}]}}}
    assert bench_prefill._planned(status, 1_843_200) == "optcc K=13"  # 1800 tokens x 256 x 4 B
    status["g-rank0.json"]["plan"]["trials"] = [{"size_bucket_bytes": 2 << 20, "kept": "direct", "modeled": "optcc",
                                                 "baseline": "direct", "modeled_s": 0.06, "baseline_s": 0.04}]
    assert bench_prefill._planned(status, 1_843_200) == "direct (modeled optcc K=13; trial 60 ms vs direct 40 ms)"
    assert bench_prefill._planned(status, 100) == "direct"
    assert bench_prefill._planned({"r.json": {"plan": {"schedule": "builtin"}}}, 100) == "builtin"
    result = {"tp": 4, "rate": "250mbit", "holds": ["h3:2:down"], "prompt_tokens": 1800, "prompts": 2, "rounds": 1,
              "schedules": {"auto": {"ok": 2, "failed": 0, "ttft_median_s": 0.5, "identical": None, "failovers": 2, "conns_out": 4,
                                     "loadavg": [3.0, 3.5], "planned": "optcc K=13"},
                            "direct": {"ok": 2, "failed": 0, "ttft_median_s": 0.75, "identical": True,
                                       "failovers": 2, "conns_out": 4, "loadavg": [3.0, 3.1], "planned": "direct"}}}
    text = bench_prefill.render(result)
    assert "0.67x" in text and "reference" in text and "optcc K=13" in text, text


def test_prefill_bench_refuses_bad_input_with_one_line():
    from r2cc_serve.errors import UserError
    from r2cc_testbed.serving import serve_prefill as bench_prefill

    with pytest.raises(UserError, match="outside"):
        bench_prefill.parse_holds(["h7:0:down"], 4, 4)
    with pytest.raises(UserError, match="flap"):
        bench_prefill.parse_holds(["h1:0:flap"], 4, 4)


def test_serve_bench_step_share_medians_and_table():
    from r2cc_testbed.serving.serve_bench import NO_SHARE_UNDER_COMPILE, median_step_share, share_lines

    def rank(wall_share, steps=100):
        return {"decode": {"steps": steps, "calls_per_step": 10.0, "coll_s_per_step": None if wall_share is None else 0.02 * wall_share,
                           "step_s": 0.02, "coll_cpu_s_per_step": 0.002, "step_cpu_s": 0.015,
                           "coll_proc_cpu_s_per_step": 0.006, "step_proc_cpu_s": 0.015,
                           "wall_share": wall_share, "cpu_share": 0.13, "proc_cpu_share": 0.4},
                "overhead_us_per_call": 3.0}

    rounds = [{"0": rank(0.5), "1": rank(0.4)}, {"0": rank(0.3), "1": rank(None, steps=0)}, {"0": rank(0.4)}]
    med = median_step_share(rounds)
    assert med["0"]["decode"]["wall_share"] == 0.4 and med["1"]["decode"]["wall_share"] == 0.4  # None left out
    assert med["1"]["decode"]["steps"] == 50 and med["0"]["overhead_us_per_call"] == 3.0
    lines = share_lines({"backends": {"default": {"step_share": med}, "r2cc": {}}})
    row = next(line for line in lines if line.startswith("default") and " 0 " in line)
    # 10 calls x 3 us of a 20 ms step: the clocks cost 0.15% of it
    assert "40.0%" in row and "13.0%" in row and "8.00 ms" in row and "20.00 ms" in row and "0.15% of a step" in row
    assert share_lines({"backends": {"r2cc": {}}}) == []
    assert NO_SHARE_UNDER_COMPILE in share_lines({"backends": {}, "step_share": NO_SHARE_UNDER_COMPILE})[0]


def test_node_env_asks_for_step_share_only_when_told(monkeypatch):
    from r2cc_testbed.serving import vllm_env

    monkeypatch.setenv("R2CC_STEP_SHARE_DIR", "/stray/from/the/caller")
    env = vllm_env.node_env(backend="default", rails=["rail0"], tmpdir="/t", status_dir="/s")
    assert "R2CC_STEP_SHARE_DIR" not in env
    env = vllm_env.node_env(backend="r2cc", rails=["rail0"], tmpdir="/t", status_dir="/s", step_share_dir="/run/x")
    assert env["R2CC_STEP_SHARE_DIR"] == "/run/x"
