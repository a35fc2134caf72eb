"""`r2cc admin` as a real server process on loopback, for the tests that drive it over HTTP."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from typing import Iterator

import httpx

from tests.comm.harness import free_port


def wait_for(check, what: str, timeout_s: float = 20.0):
    """check()'s first truthy answer, polled every 0.1 s; fails the test after timeout_s."""
    deadline = time.time() + timeout_s
    while True:
        got = check()
        if got or time.time() > deadline:
            assert got, f"timed out waiting for {what}"
            return got
        time.sleep(0.1)


def _answers(base: str) -> bool:
    try:
        return httpx.get(base + "/r2cc/v1/health", timeout=1).status_code in (200, 503)
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def admin_server(status_dir: str, token: str, log_path) -> Iterator[str]:
    """`r2cc admin` over the ranks whose status files are in status_dir, with R2CC_ADMIN_TOKEN=token
    and its output in log_path; yields its base URL once it answers."""
    port = free_port()
    with open(log_path, "w") as out:
        server = subprocess.Popen([sys.executable, "-m", "r2cc_serve.cli", "admin", "--port", str(port),
                                   "--status-dir", status_dir], env=dict(os.environ, R2CC_ADMIN_TOKEN=token),
                                  stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(base), "the admin server")
        yield base
    finally:
        server.terminate()
        server.wait(timeout=10)
