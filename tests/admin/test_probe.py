"""`r2cc admin probe-latency` against a small local HTTP server (no vLLM needed)."""

import http.server
import json
import threading

import pytest

from r2cc_serve.admin import probe
from r2cc_serve.errors import UserError


class _Server(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    BODIES = {"/v1/models": {"object": "list", "data": [{"id": "tiny"}]}, "/health": {},
              "/r2cc/v1/rails": {"rails": [], "updated": 0.0}}

    def do_GET(self):
        body = json.dumps(self.BODIES.get(self.path, {"detail": "Not Found"})).encode()
        self.send_response(200 if self.path in self.BODIES else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def base():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_latency_is_reported_with_and_without_the_clients_own_cpu_wait(base):
    out = probe.measure(base, 60, interval_s=0)
    for path in ("/r2cc/v1/rails", "/health"):
        st = out[path]
        assert st["n"] == 60 and st["net"]["n"] == 60 and st["client_wait"]["n"] == 60
        assert 0 < st["net"]["p50_ms"] <= st["p50_ms"] and st["net"]["max_ms"] <= st["max_ms"]
        assert st["client_wait"]["max_ms"] >= 0


def test_run_queue_wait_reads_this_threads_counter():
    w0 = probe.run_queue_wait_s()
    sum(range(200_000))  # some CPU time; the counter never goes back
    assert probe.run_queue_wait_s() >= w0 >= 0.0


def test_a_load_model_the_server_does_not_serve_is_refused_up_front(base):
    probe.check_served(base, "tiny")
    with pytest.raises(UserError, match="does not serve it; it serves tiny"):
        probe.check_served(base, "/tmp/tiny")
    with pytest.raises(UserError, match="did not list the served models"):
        probe.check_served(base + "/nothing-here", "tiny")
