"""Where the admin token comes from (R2CC_ADMIN_TOKEN, R2CC_ADMIN_TOKEN_FILE) and how a bad one is reported."""

import os
import subprocess
import sys

import pytest

from r2cc_serve.admin.auth import configured_token
from r2cc_serve.errors import UserError


def test_token_from_a_file_is_read_and_stripped_and_the_environment_wins(tmp_path, monkeypatch):
    f = tmp_path / "token"
    f.write_text("s3cret\n")
    monkeypatch.delenv("R2CC_ADMIN_TOKEN", raising=False)
    monkeypatch.setenv("R2CC_ADMIN_TOKEN_FILE", str(f))
    assert configured_token() == "s3cret"
    monkeypatch.setenv("R2CC_ADMIN_TOKEN", "from-env")
    assert configured_token() == "from-env"
    monkeypatch.delenv("R2CC_ADMIN_TOKEN")
    monkeypatch.delenv("R2CC_ADMIN_TOKEN_FILE")
    assert configured_token() is None  # no token: mutations answer 403


def test_an_unreadable_token_file_is_named_in_the_error(tmp_path, monkeypatch):
    monkeypatch.delenv("R2CC_ADMIN_TOKEN", raising=False)
    monkeypatch.setenv("R2CC_ADMIN_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(UserError, match="R2CC_ADMIN_TOKEN_FILE=.*missing: cannot read it"):
        configured_token()


def test_r2cc_admin_with_an_unreadable_token_file_exits_with_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "R2CC_ADMIN_TOKEN"}
    env["R2CC_ADMIN_TOKEN_FILE"] = str(tmp_path / "missing")
    out = subprocess.run([sys.executable, "-m", "r2cc_serve.cli", "admin", "--status-dir", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "cannot read it" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_only_loopback_binds_count_as_local():
    from r2cc_serve.admin.cli import _is_loopback

    assert _is_loopback("127.0.0.1") and _is_loopback("::1") and _is_loopback("localhost")
    assert not _is_loopback("0.0.0.0") and not _is_loopback("10.200.0.254") and not _is_loopback("admin.example")


def test_inside_vllm_an_unreadable_token_file_disables_mutations_with_the_reason(tmp_path, monkeypatch):
    """vLLM's API server must keep serving: reads work, drain answers 403 naming the file."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from r2cc_serve.vllm.endpoint import R2CCAdminEndpoint

    monkeypatch.delenv("R2CC_ADMIN_TOKEN", raising=False)
    monkeypatch.setenv("R2CC_ADMIN_TOKEN_FILE", str(tmp_path / "missing"))
    endpoint = R2CCAdminEndpoint()
    app = FastAPI()
    endpoint.attach_router(app)
    with TestClient(app) as client:
        r = client.post("/r2cc/v1/rails/h0/1/drain", headers={"Authorization": "Bearer anything"})
        assert r.status_code == 403 and "missing: cannot read it" in r.json()["detail"], r.text


def test_every_admin_route_checks_tokens_on_the_event_loop():
    # FastAPI runs a plain-def dependency in its thread pool: one more thread to wake and the GIL
    # to win back twice per request. With two other Python threads busy, that hop took a read's
    # p99 from ~19 to ~30 ms in a probe (uvicorn, SCHED_FIFO client); the token checks are
    # cheap, so every dependency of the admin routes must be a coroutine.
    import inspect

    from fastapi.routing import APIRoute

    from r2cc_serve.admin.app import create_app

    def plain(dependant):
        for d in dependant.dependencies:
            if d.call is not None and not inspect.iscoroutinefunction(d.call):
                yield d.call
            yield from plain(d)

    routes = [r for r in create_app(token="t", read_token="r").routes if isinstance(r, APIRoute)]
    assert len(routes) > 5
    offenders = {f"{r.path}: {getattr(c, '__qualname__', c)}" for r in routes for c in plain(r.dependant)}
    assert not offenders, offenders
