"""Actions when a rank's control agent does not answer (in-process app, no group running)."""

import socket

import pytest
from fastapi.testclient import TestClient

from r2cc_serve.admin import create_app
from r2cc_serve.admin.sources import AgentRef, StaticSource
from r2cc_serve.admin.view import GroupView

TOKEN = "t0ken"


def _dead_address() -> str:
    with socket.socket() as s:  # bound then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_an_agent_that_does_not_answer_gives_503_not_unknown_host():
    source = StaticSource([AgentRef(_dead_address(), "x", "tp:0", 0)])
    with TestClient(create_app(source=source, token=TOKEN)) as client:
        r = client.post("/r2cc/v1/rails/r2cc-h0/1/drain", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 503, r.text
        assert "did not answer" in r.json()["detail"] and "nothing was changed" in r.json()["detail"]
        assert "unreachable" in r.json()["detail"]  # says why


def test_a_host_never_seen_is_404_when_every_agent_answers():
    view = GroupView(StaticSource([]))
    with pytest.raises(Exception) as info:
        view._act("nohost", 0, "drain", force=False)
    assert getattr(info.value, "status", None) == 404
