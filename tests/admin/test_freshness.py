"""How old the admin view's numbers are, and that they never go back (in-process, fake agents).

A rank's monitor samples its counters once per R2CC_STATUS_REFRESH_MS, so right after a short
load the view can still show the bytes from before it; and a rank that missed a poll is shown by
its last answer for a while. Each rail entry says when its numbers were sampled (`sampled_at`)
and whether a late answer stands in (`stale`), so that a reader tells either from rails that
stopped carrying bytes."""

import json
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest

from r2cc_serve.admin.render import render_stale
from r2cc_serve.admin.metrics import R2CCCollector
from r2cc_serve.admin.snapshot import Snapshot
from r2cc_serve.admin.sources import AgentRef, StaticSource
from r2cc_serve.admin.view import GroupView

PROC = {"pid": 10, "start": 1}


def _state(host: str, rank: int, sent: int, at: float | None = 1000.0, seq: int | None = 1, process=PROC) -> dict:
    rails = [{"rail": r, "interface": f"rail{r}", "address": f"10.0.{r}.1", "fallback": False, "state": "up",
              "peer": 1 - rank, "bandwidth_Bps": 0.0, "rtt_s": 0.0, "bytes_sent": sent, "bytes_recv": 0,
              "chunks_resent": 0, "bytes_resent": 0, "failovers": 0, "last_detect_s": 0.0, "last_error": "",
              "last_error_time": 0.0} for r in (0, 1)]
    st = {"host": host, "rank": rank, "status": "ok", "reasons": [], "rails": rails, "events": [], "process": process}
    return st | ({"time": at} if at is not None else {}) | ({"seq": seq} if seq is not None else {})


def _view(answers):
    """A view whose agents answer from `answers` (one list per refresh: a state or why not)."""
    refs = [AgentRef("127.0.0.1:1", "x", "tp:0", 0), AgentRef("127.0.0.1:2", "x", "tp:0", 1)]
    view = GroupView(StaticSource(refs))
    rounds = iter(answers)
    current: dict = {}

    def fetch(a, fresh, timeout_s=1.0):
        if a.rank == 0:
            current["round"] = next(rounds)
        return current["round"][a.rank]
    view._fetch = fetch
    return view


def _rail(snap: Snapshot, host: str, rail: int = 0) -> dict:
    return next(r for r in json.loads(snap.rails_json)["rails"] if r["host"] == host and r["rail"] == rail)


def test_every_rail_says_when_its_host_sampled_it_and_whether_a_late_answer_stands_in():
    states = {("tp:0", 0): _state("h0", 0, 100, at=1000.0), ("tp:0", 1): _state("h1", 1, 200, at=1001.5),
              ("pp:0", 0): _state("h0", 0, 50, at=999.0)}  # a second group of rank 0's host
    snap = Snapshot.build(states, {}, (), updated=1002.0, carried={("tp:0", 1)})
    h0, h1 = _rail(snap, "h0"), _rail(snap, "h1", 1)
    assert (h0["sampled_at"], h0["stale"]) == (999.0, False), "the oldest sample of the host's ranks"
    assert (h1["sampled_at"], h1["stale"]) == (1001.5, True)
    assert snap.hosts["h1"][1]["stale"] and snap.hosts["h0"][0]["sampled_at"] == 999.0  # the per-host view too
    # An agent of an older build does not say: null, not a made-up time.
    old = Snapshot.build({("tp:0", 0): _state("h0", 0, 1, at=None, seq=None)}, {}, ())
    assert _rail(old, "h0")["sampled_at"] is None and not _rail(old, "h0")["stale"]


def test_a_missed_poll_shows_stale_with_the_old_sample_time_then_fresh_again():
    late = "agent unreachable (ReadTimeout)"
    view = _view([[_state("h0", 0, 100, at=1000.0), _state("h1", 1, 10, at=1000.0)],
                  [late, _state("h1", 1, 20, at=1001.0, seq=2)],
                  [_state("h0", 0, 300, at=1002.0, seq=3), _state("h1", 1, 30, at=1002.0, seq=3)]])
    view.refresh()
    missed = view.refresh()
    assert (_rail(missed, "h0")["stale"], _rail(missed, "h0")["sampled_at"]) == (True, 1000.0)
    assert (_rail(missed, "h1")["stale"], _rail(missed, "h1")["sampled_at"]) == (False, 1001.0)
    back = view.refresh()
    assert (_rail(back, "h0")["stale"], _rail(back, "h0")["sampled_at"], _rail(back, "h0")["bytes_sent"]) == \
        (False, 1002.0, 300)


def test_a_read_that_returns_an_older_sample_does_not_take_the_counters_back():
    """A poll that reached an agent before an action's fresh read and returned after it: the
    view keeps the newer sample. A restarted process numbers its samples anew: taken as it is."""
    view = _view([[_state("h0", 0, 500, at=1005.0, seq=7), _state("h1", 1, 5, at=1005.0, seq=7)],
                  [_state("h0", 0, 400, at=1004.0, seq=6), _state("h1", 1, 6, at=1006.0, seq=8)],
                  [_state("h0", 0, 3, at=1010.0, seq=1, process={"pid": 11, "start": 2}),
                   _state("h1", 1, 7, at=1007.0, seq=9)]])
    view.refresh()
    kept = view.refresh()
    assert (_rail(kept, "h0")["bytes_sent"], _rail(kept, "h0")["sampled_at"]) == (500, 1005.0)
    assert not _rail(kept, "h0")["stale"], "the rank answered: its newest sample is not stale"
    assert _rail(kept, "h1")["bytes_sent"] == 6
    restarted = view.refresh()
    assert (_rail(restarted, "h0")["bytes_sent"], _rail(restarted, "h0")["sampled_at"]) == (3, 1010.0)
    # An action's reply folded in is held to the same rule.
    view._fold({("tp:0", 1): _state("h1", 1, 1, at=1000.0, seq=2)})
    assert _rail(view.snap, "h1")["bytes_sent"] == 7


def _metrics(snap: Snapshot) -> str:
    reg = CollectorRegistry()
    reg.register(R2CCCollector(SimpleNamespace(snap=snap)))
    return generate_latest(reg).decode()


def test_metrics_give_each_ranks_sample_age_and_whether_it_is_stale():
    import time

    now = time.time()
    states = {("tp:0", 0): _state("h0", 0, 1, at=now - 30.0), ("tp:0", 1): _state("h1", 1, 1, at=now - 0.5),
              ("tp:0", 2): _state("h2", 2, 1, at=None)}
    text = _metrics(Snapshot.build(states, {}, (), carried={("tp:0", 0)}))
    ages = {line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("r2cc_rank_sample_age_seconds{")}
    assert 30.0 <= ages['host="h0",rank="0"'] < 40.0 and 0.5 <= ages['host="h1",rank="1"'] < 10.0, ages
    assert 'r2cc_rank_sample_age_seconds{host="h2"' not in text, "an agent of an older build: no made-up age"
    assert 'r2cc_rank_stale{host="h0",rank="0"} 1.0' in text and 'r2cc_rank_stale{host="h1",rank="1"} 0.0' in text


def test_r2cc_rails_names_hosts_shown_by_a_late_answer():
    rails = [{"host": "h0", "rail": 0, "stale": True, "sampled_at": 990.0},
             {"host": "h0", "rail": 1, "stale": True, "sampled_at": 990.0},
             {"host": "h1", "rail": 0, "stale": False, "sampled_at": 999.0}]
    assert render_stale(rails, 1000.0) == "stale:\n  h0: a rank missed the last poll; its numbers are from 10.0 s ago"
    assert render_stale(rails[2:], 1000.0) == ""
