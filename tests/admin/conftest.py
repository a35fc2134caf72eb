"""A small local HTTP server standing in for vLLM in the admin tests that need no real one."""

import http.server
import json
import threading

import pytest


class _Stub(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    BODIES = {"/v1/models": {"object": "list", "data": [{"id": "tiny"}]}, "/health": {},
              "/r2cc/v1/rails": {"rails": [], "updated": 0.0}, "/r2cc/v1/health": {"status": "ok", "reasons": []}}

    def do_GET(self):
        body = json.dumps(self.BODIES.get(self.path, {"detail": "Not Found"})).encode()
        self.send_response(200 if self.path in self.BODIES else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def stub_server():
    """Base URL of a server with vLLM's /v1/models and /health, an empty /r2cc/v1/rails and an ok
    /r2cc/v1/health;
    any other path answers 404 {"detail": "Not Found"}, as vLLM does for an unknown route."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
