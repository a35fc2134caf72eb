"""Who may look: reads need R2CC_ADMIN_READ_TOKEN, vLLM's --api-key or the admin token once one of
the first two is set; the audit detail (client addresses, token fingerprints) needs the admin token."""

import argparse
import asyncio

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from r2cc_serve.admin import create_app
from r2cc_serve.admin.auth import fingerprint
from r2cc_serve.admin.snapshot import without_decision_authors, without_decision_authors_in
from r2cc_serve.admin.sources import StaticSource

ADMIN, READ, API_KEY = "admin-secret", "read-secret", "vllm-key"
READS = ["/r2cc/v1/rails", "/r2cc/v1/rails/h0/1", "/r2cc/v1/health", "/r2cc/v1/events", "/r2cc/v1/plan", "/metrics"]


def _bearer(token):
    return {"Authorization": f"Bearer {token}"}


def _with_an_admin_event(client):
    """A refused drain (wrong token) leaves an admin event with the caller's address and fingerprint."""
    assert client.post("/r2cc/v1/rails/h0/1/drain", headers=_bearer("wrong")).status_code == 401


@pytest.fixture
def closed():
    with TestClient(create_app(source=StaticSource([]), token=ADMIN, read_token=READ)) as client:
        _with_an_admin_event(client)
        yield client


@pytest.mark.parametrize("path", READS)
def test_a_read_without_a_fitting_token_is_refused_with_what_to_send_and_nothing_else(closed, path):
    for headers in ({}, _bearer("wrong"), {"Authorization": READ}, {"Authorization": "Basic " + READ}):
        r = closed.get(path, headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (path, headers, r.text)
        assert r.json() == {"detail": "reads of this admin API need a token: send Authorization: Bearer <token>, "
                                      "the token being R2CC_ADMIN_READ_TOKEN or R2CC_ADMIN_TOKEN"}, r.text
        assert "testclient" not in r.text and "rails" not in r.text.replace("reads", "")


@pytest.mark.parametrize("token", [READ, ADMIN])
@pytest.mark.parametrize("path", READS)
def test_the_read_token_and_the_admin_token_may_read(closed, path, token):
    r = closed.get(path, headers=_bearer(token))
    # No group attached: one rail is unknown (404), health is down (503); neither is a refusal.
    assert r.status_code in (200, 404, 503) and "need a token" not in r.text, (path, r.status_code, r.text)


def test_the_audit_detail_needs_the_admin_token(closed):
    shown = closed.get("/r2cc/v1/events", params={"kind": "admin"}, headers=_bearer(ADMIN)).json()["events"]
    assert [(e["client"], e["by"]) for e in shown] == [("testclient", fingerprint("wrong"))]
    hidden = closed.get("/r2cc/v1/events", params={"kind": "admin"}, headers=_bearer(READ)).json()["events"]
    assert [(e["action"], e["result"], e["client"], e["by"]) for e in hidden] == [
        ("drain", "unauthorized", "redacted", "redacted")]


def test_reads_are_open_when_no_read_token_and_no_api_key_is_set():
    with TestClient(create_app(source=StaticSource([]), token=ADMIN, read_token="")) as client:
        _with_an_admin_event(client)
        for path in READS:
            assert client.get(path).status_code in (200, 404, 503), path
        ev = client.get("/r2cc/v1/events").json()["events"][-1]
        assert ev["client"] == "testclient" and ev["by"] != "redacted"  # as before this knob existed


def test_decision_authors_are_redacted_in_rails_and_health():
    rails = [{"host": "h0", "rail": 1, "decisions": [{"action": "drain", "reason": "x", "by": "1a2b3c4d", "at": 1.0}]},
             {"host": "h0", "rail": 2, "decisions": []}]
    bare = without_decision_authors(rails)
    assert bare[0]["decisions"][0]["by"] == "redacted" and rails[0]["decisions"][0]["by"] == "1a2b3c4d"
    assert without_decision_authors(rails[1:]) == rails[1:]  # no decision: nothing to hide
    health = {"status": "degraded", "reasons": ["h0 (rank 0): rail1 drain by 1a2b3c4d at 2026-11-26 10:00:00 UTC: x"]}
    assert without_decision_authors_in(health)["reasons"] == [
        "h0 (rank 0): rail1 drain by redacted at 2026-11-26 10:00:00 UTC: x"]


def _endpoint_app(monkeypatch, args):
    from r2cc_serve.vllm.endpoint import R2CCAdminEndpoint

    monkeypatch.setenv("R2CC_ADMIN_TOKEN", ADMIN)
    monkeypatch.delenv("R2CC_ADMIN_TOKEN_FILE", raising=False)
    monkeypatch.delenv("R2CC_ADMIN_READ_TOKEN", raising=False)
    endpoint = R2CCAdminEndpoint()
    app = FastAPI()
    endpoint.attach_router(app)
    asyncio.run(endpoint.init_state(None, app.state, args))  # the render server's way: no engine
    return app


def test_inside_vllm_the_api_key_admits_reads_and_not_the_audit_detail(monkeypatch):
    app = _endpoint_app(monkeypatch, argparse.Namespace(api_key=["other-key", API_KEY]))
    with TestClient(app) as client:
        _with_an_admin_event(client)
        r = client.get("/r2cc/v1/events")
        assert r.status_code == 401 and "vLLM's --api-key or R2CC_ADMIN_TOKEN" in r.json()["detail"], r.text
        assert "testclient" not in r.text
        ev = client.get("/r2cc/v1/events", headers=_bearer(API_KEY)).json()["events"][-1]
        assert (ev["client"], ev["by"]) == ("redacted", "redacted")
        ev = client.get("/r2cc/v1/events", headers=_bearer(ADMIN)).json()["events"][-1]
        assert (ev["client"], ev["by"]) == ("testclient", fingerprint("wrong"))


def test_inside_vllm_without_an_api_key_reads_stay_open(monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    app = _endpoint_app(monkeypatch, argparse.Namespace(api_key=None))
    with TestClient(app) as client:
        assert client.get("/r2cc/v1/rails").status_code == 200


def test_r2cc_rails_names_what_to_set_when_reads_are_closed(closed):
    from r2cc_serve.admin.client import get_doc
    from r2cc_serve.errors import UserError

    with pytest.raises(UserError, match="401: this admin API needs a token for reads; set R2CC_ADMIN_READ_TOKEN"):
        get_doc(closed, "http://testserver/r2cc/v1/rails", "rails")
    closed.headers["Authorization"] = f"Bearer {READ}"
    assert get_doc(closed, "http://testserver/r2cc/v1/rails", "rails")["rails"] == []
