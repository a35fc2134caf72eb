"""The metrics that alert rules and the dashboard join on, from a made-up snapshot (pure)."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest

from r2cc_serve.admin.metrics import R2CCCollector


def _rail(host, rail, state, fallback=False):
    return {"host": host, "rail": rail, "state": state, "fallback": fallback, "bandwidth_Bps": 1e8, "rtt_s": 1e-4,
            "bytes_sent": 10, "bytes_received": 10, "chunks_resent": 0, "failovers": 0, "detection_s": 0.0}


def _text(rails, mutations_enabled=True) -> str:
    snap = SimpleNamespace(rails=rails, states={}, health={"status": "degraded", "reasons": []},
                           plans=lambda: [{"group": "tp:0", "schedule": "auto"}])
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
