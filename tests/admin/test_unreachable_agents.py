"""Actions when a rank's control agent does not answer (in-process app, no group running)."""

import socket
import time

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


def test_one_missed_poll_keeps_the_last_answer_then_the_rank_is_unreachable(monkeypatch):
    """A worker busy with the model may miss one poll; only a longer silence is reported."""
    from r2cc_serve.admin import view as view_mod

    ref = AgentRef("127.0.0.1:1", "x", "tp:0", 0)
    state = {"host": "h0", "rank": 0, "status": "ok", "reasons": [], "rails": [], "events": []}
    answers = iter([state, "agent unreachable (ReadTimeout)", "agent unreachable (ReadTimeout)"])
    v = GroupView(StaticSource([ref]))
    monkeypatch.setattr(v, "_fetch", lambda a, fresh, timeout_s: next(answers))
    first = v.refresh()
    assert first.states == {("tp:0", 0): state} and first.current(10.0)
    missed = v.refresh()
    assert missed.states == {("tp:0", 0): state} and not missed.unreachable
    assert not missed.current(10.0), "an action must not decide on a late rank's old answer"
    monkeypatch.setattr(view_mod, "AGENT_STALE_S", 0.0)
    gone = v.refresh()
    assert "ReadTimeout" in gone.unreachable[("tp:0", 0)]
    assert gone.health["status"] == "degraded"
    # still shown by its last answer, marked stale: its counters must not vanish from the totals
    assert gone.states == {("tp:0", 0): state} and ("tp:0", 0) in gone.carried


def test_a_hosts_totals_do_not_drop_while_one_of_its_ranks_is_silent(monkeypatch):
    """Two ranks on one host: when one stops answering for longer than AGENT_STALE_S, the host's rail
    totals keep its last counters (a drop would read as a counter reset), and health names the rank."""
    from r2cc_serve.admin import view as view_mod

    refs = [AgentRef(f"127.0.0.1:{1 + r}", "x", "tp:0", r) for r in range(3)]
    states = {r: _agent_state("h0" if r < 2 else "h1", r, 2 if r < 2 else 0) for r in range(3)}
    for r, st in states.items():
        for c in st["rails"]:
            c["bytes_sent"] = 1000 * (r + 1)
    silent = {"on": False}

    def fetch(a, fresh, timeout_s):
        return "agent unreachable (ReadTimeout)" if silent["on"] and a.rank == 1 else states[a.rank]

    v = GroupView(StaticSource(refs))
    monkeypatch.setattr(v, "_fetch", fetch)
    before = {r["rail"]: r["bytes_sent"] for r in v.refresh().hosts["h0"]}
    assert before == {0: 3000, 1: 3000}
    silent["on"] = True
    monkeypatch.setattr(view_mod, "AGENT_STALE_S", 0.0)
    after = v.refresh()
    assert {r["rail"]: r["bytes_sent"] for r in after.hosts["h0"]} == before
    assert all(r["stale"] for r in after.hosts["h0"]) and not any(r["stale"] for r in after.hosts["h1"])
    assert after.health["status"] == "degraded"
    assert any("rank 1" in why and "ReadTimeout" in why for why in after.health["reasons"])
    with pytest.raises(Exception) as info:  # acting on part of a host stays refused
        v._act("h0", 1, "drain", force=False)
    assert getattr(info.value, "status", None) == 503


def _agent_state(host: str, rank: int, peer: int) -> dict:
    rail = {"rail": 1, "interface": "rail1", "address": "10.0.0.1", "fallback": False, "state": "up", "peer": peer,
            "bandwidth_Bps": 0.0, "rtt_s": 0.0, "bytes_sent": 0, "bytes_recv": 0, "chunks_resent": 0,
            "bytes_resent": 0, "failovers": 0, "last_detect_s": 0.0, "last_error": "", "last_error_time": 0.0}
    other = dict(rail, rail=0, interface="rail0")
    return {"host": host, "rank": rank, "status": "ok", "reasons": [], "rails": [other, rail], "events": []}


def test_an_action_answers_with_the_agents_reply_and_reads_nothing_back(monkeypatch):
    """One round trip to the (busy) workers per action: the agent's reply carries its state after
    the action, which GET shows at once; no second read of the agents."""
    ref = AgentRef("127.0.0.1:1", "x", "tp:0", 0)
    before = _agent_state("h0", 0, 1)
    after = _agent_state("h0", 0, 1)
    after["rails"][1]["state"] = "drained"
    answers = iter([before])  # the pre-action read; a read-back would find this exhausted
    app = create_app(source=StaticSource([ref]), token=TOKEN)
    view = app.state.r2cc.view
    monkeypatch.setattr(view, "_fetch", lambda a, fresh, timeout_s: next(answers))
    monkeypatch.setattr(view, "_post", lambda a, path, *note: after)
    monkeypatch.setattr(view, "start", lambda loop: None)  # no poller: this test drives every read
    view._first.set()
    with TestClient(app) as client:
        r = client.post("/r2cc/v1/rails/h0/1/drain", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200, r.text
        assert r.json()["state"] == "drained" and r.json()["ranks"] == [0], r.json()
        assert client.get("/r2cc/v1/rails/h0/1").json()["state"] == "drained"
        # The picture is now current: the next action decides on it without reading the agents.
        monkeypatch.setattr(view, "_post", lambda a, path, *note: before)
        r = client.post("/r2cc/v1/rails/h0/1/undrain", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200 and r.json()["state"] == "up", r.text


def test_an_outcome_nobody_reported_is_a_valid_answer():
    """Done, but no reply said how the rail stands (the response model once rejected it: HTTP 500)."""
    from r2cc_serve.admin.models import ActionResult

    assert ActionResult(host="h0", rail=1, action="drain", ranks=[0], state="unknown").state == "unknown"


def test_an_actions_fold_does_not_make_the_other_ranks_answers_look_new():
    """A fold replaces the acting ranks' states only: the picture is as old as its oldest answer,
    so the next action re-reads the others once that is past the bound."""
    from r2cc_serve.admin.snapshot import Snapshot

    states = {("tp:0", 0): _agent_state("h0", 0, 1), ("tp:0", 1): _agent_state("h1", 1, 0)}
    polled = Snapshot.build(states, {}, (), updated=time.time() - 2.0)
    assert not polled.current(1.0)
    folded = polled.with_states({("tp:0", 0): _agent_state("h0", 0, 1)})
    assert folded.updated > polled.updated  # published now
    assert not folded.current(1.0), "rank 1's answer is still 2 s old"
