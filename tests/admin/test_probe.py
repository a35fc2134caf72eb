"""`r2cc admin probe-latency` against a small local HTTP server (no vLLM needed)."""

import pytest

from r2cc_testbed.serving import admin_latency as probe
from r2cc_serve.errors import UserError


def test_latency_is_reported_with_and_without_the_clients_own_cpu_wait(stub_server):
    out = probe.measure(stub_server, 60, interval_s=0)
    for path in ("/r2cc/v1/rails", "/health"):
        st = out[path]
        assert st["n"] == 60 and st["net"]["n"] == 60 and st["client_wait"]["n"] == 60
        assert 0 < st["net"]["p50_ms"] <= st["p50_ms"] and st["net"]["max_ms"] <= st["max_ms"]
        assert st["client_wait"]["max_ms"] >= 0


def test_run_queue_wait_reads_this_threads_counter():
    w0 = probe.run_queue_wait_s()
    sum(range(200_000))  # some CPU time; the counter never goes back
    assert probe.run_queue_wait_s() >= w0 >= 0.0


def test_a_load_model_the_server_does_not_serve_is_refused_up_front(stub_server):
    probe.check_served(stub_server, "tiny")
    with pytest.raises(UserError, match="does not serve it; it serves tiny"):
        probe.check_served(stub_server, "/tmp/tiny")
    with pytest.raises(UserError, match="did not list the served models"):
        probe.check_served(stub_server + "/nothing-here", "tiny")
