"""The metrics that alert rules and the dashboard join on, from a made-up snapshot (pure)."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest

from r2cc_serve.admin.metrics import R2CCCollector


def _rail(host, rail, state, fallback=False):
    return {"host": host, "rail": rail, "state": state, "fallback": fallback, "bandwidth_Bps": 1e8, "rtt_s": 1e-4,
            "bytes_sent": 10, "bytes_received": 10, "chunks_resent": 0, "failovers": 0, "detection_s": 0.0}


def _text(rails, mutations_enabled=True, states=None, carried=frozenset()) -> str:
    snap = SimpleNamespace(rails=rails, states=states or {}, health={"status": "degraded", "reasons": []},
                           plans=lambda: [{"group": "tp:0", "schedule": "auto"}], carried=carried)
    reg = CollectorRegistry()
    reg.register(R2CCCollector(SimpleNamespace(snap=snap), mutations_enabled=mutations_enabled))
    return generate_latest(reg).decode()


def test_host_gauges_count_data_rails_and_name_the_fallback():
    text = _text([_rail("node0", 0, "up"), _rail("node0", 1, "down"), _rail("node0", 2, "slow"),
                  _rail("node0", 3, "up", fallback=True), _rail("node1", 0, "drained"), _rail("node1", 1, "up")])
    for line in ('r2cc_host_rails{host="node0"} 3.0', 'r2cc_host_rails_up{host="node0"} 2.0',
                 'r2cc_host_rails{host="node1"} 2.0', 'r2cc_host_rails_up{host="node1"} 1.0',
                 'r2cc_rail_fallback{host="node0",rail="3"} 1.0', 'r2cc_plan_schedule{group="tp:0",schedule="auto"} 1.0',
                 "r2cc_admin_token_configured 1.0", 'r2cc_rail_state{host="node0",rail="1",state="down"} 1.0'):
        assert line in text, line
    assert 'r2cc_rail_fallback{host="node1"' not in text


def test_no_token_shows_as_mutations_refused():
    assert "r2cc_admin_token_configured 0.0" in _text([_rail("node0", 0, "up")], mutations_enabled=False)


def _conn(peer, state, hold_reason="", hold_left_s=0.0, flap_failures=0):
    return {"peer": peer, "peer_host": f"node{peer}", "rail": 2, "address": "10.0.2.1", "state": state,
            "fallback": False, "bandwidth_Bps": 1e8, "rtt_s": 1e-4, "bytes_sent": 0, "bytes_recv": 0,
            "chunks_resent": 0, "bytes_resent": 0, "failovers": flap_failures, "last_detect_s": 0.06,
            "last_error": "", "last_error_time": 0.0, "flap_failures": flap_failures, "flap_penalty": 2.9,
            "holds": 1 if hold_reason else 0, "hold_left_s": hold_left_s, "hold_reason": hold_reason}


def test_a_held_rail_is_shown_held_with_why_and_time_left():
    from r2cc_serve.admin.render import render_holds
    from r2cc_serve.admin.snapshot import rail_view

    view = rail_view([_conn(1, "up", flap_failures=1),
                      _conn(2, "held", "flapping: 3 failures, penalty 2.9 >= 2.0", 7.5, flap_failures=3)])
    assert view["state"] == "held"  # the worst connection's state is the host's rail's
    assert view["flap_failures"] == 4
    assert view["hold"]["reason"].startswith("flapping: 3 failures") and view["hold"]["left_s"] == 7.5
    assert rail_view([_conn(1, "up")])["hold"] is None
    line = render_holds([dict(view, host="node0")])
    assert "node0 rail2: held 8 s more after 4 failures" in line and "r2cc rails restore node0:2" in line
    text = _text([dict(view, host="node0", detection_s=0.06)])
    for want in ('r2cc_rail_state{host="node0",rail="2",state="held"} 1.0', 'r2cc_rail_up{host="node0",rail="2"} 0.0',
                 'r2cc_rail_hold_seconds{host="node0",rail="2"} 7.5',
                 'r2cc_rail_flap_failures_total{host="node0",rail="2"} 4.0'):
        assert want in text, want


def test_a_lossy_rail_is_shown_held_for_loss():
    from r2cc_serve.admin.render import render_holds
    from r2cc_serve.admin.snapshot import rail_view

    lossy = dict(_conn(1, "held", "lossy: 4.8% of 1784 segments retransmitted over 2.3 s, in 6 of its samples", 9.0),
                 retrans_pct=4.8, loss_holds=1)
    view = rail_view([lossy, dict(_conn(2, "up"), retrans_pct=0.01, loss_holds=0)])
    assert view["state"] == "held" and view["retrans_pct"] == 4.8 and view["loss_holds"] == 1
    assert view["hold"]["reason"].startswith("lossy: 4.8%")
    line = render_holds([dict(view, host="node0")])
    assert "node0 rail2: held 9 s more after losing packets (lossy: 4.8%" in line, line
    text = _text([dict(view, host="node0", detection_s=0.06)])
    for want in ('r2cc_rail_state{host="node0",rail="2",state="held"} 1.0',
                 'r2cc_rail_retransmit_percent{host="node0",rail="2"} 4.8',
                 'r2cc_rail_loss_holds_total{host="node0",rail="2"} 1.0'):
        assert want in text, want


def test_spin_waits_are_summed_per_rank_and_pressure_is_per_host():
    def state(host, hits, misses, skips, pressure, briefs=0):
        return {"host": host, "counters": {"spin_hits": hits, "spin_misses": misses, "spin_skips": skips,
                                           "spin_briefs": briefs, "cpu_pressure": pressure}}

    states = {("tp:0", 0): state("node0", 90, 10, 5, 0.02, briefs=30), ("world", 0): state("node0", 1, 0, 0, 0.04),
              ("tp:0", 1): state("node1", 0, 0, 700, 0.6), ("old", 2): {"host": "node2", "counters": {}}}
    text = _text([_rail("node0", 0, "up")], states=states)
    for want in ('r2cc_spin_waits_total{host="node0",outcome="hit",rank="0"} 91.0',
                 'r2cc_spin_waits_total{host="node0",outcome="miss",rank="0"} 10.0',
                 'r2cc_spin_waits_total{host="node1",outcome="skip",rank="1"} 700.0',
                 'r2cc_spin_brief_waits_total{host="node0",rank="0"} 30.0',
                 'r2cc_host_cpu_pressure{host="node0"} 0.04', 'r2cc_host_cpu_pressure{host="node1"} 0.6'):
        assert want in text, (want, [l for l in text.splitlines() if "spin" in l or "pressure" in l])
    assert 'host="node2"' not in text  # an agent of an older build: no made-up zeros


def test_process_stalls_are_the_most_any_group_of_a_rank_saw():
    states = {("tp:0", 0): {"host": "node0", "counters": {"own_stalls": 3}},
              ("world", 0): {"host": "node0", "counters": {"own_stalls": 5}},
              ("tp:0", 1): {"host": "node1", "counters": {"own_stalls": 0}},
              ("old", 2): {"host": "node2", "counters": {}}}
    text = _text([_rail("node0", 0, "up")], states=states)
    stalls = sorted(l for l in text.splitlines() if l.startswith("r2cc_process_stalls_total"))
    assert stalls == ['r2cc_process_stalls_total{host="node0",rank="0"} 5.0',
                      'r2cc_process_stalls_total{host="node1",rank="1"} 0.0'], stalls
