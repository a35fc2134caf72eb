"""The log lines the serving tools read back are parsed by the module that writes them."""

from r2cc_serve.health import loglines
from r2cc_testbed.serving import evidence


def test_a_transition_survives_a_log_prefix_and_parentheses_in_its_reason():
    line = loglines.transition_line("tp:0", 1, 2, 0, "up", "down", "rail2 to rank 0: no bytes for 62 ms (link down)")
    t = evidence._parse(f"(Worker_TP1 pid=7) WARNING 11-23 18:00:01 [monitor.py:95] {line}\n", 5.0, "node0.log")
    assert (t.group, t.rank, t.rail, t.peer, t.old, t.new) == ("tp:0", 1, 2, 0, "up", "down")
    assert t.reason.endswith("(link down)") and t.seen_at == 5.0 and t.source == "node0.log"
    assert loglines.parse_transition(loglines.transition_line("g", 0, 1, 1, "down", "up"))["reason"] == ""
    assert loglines.parse_transition("r2cc: something else") is None


def test_the_rails_a_group_came_up_on(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text("noise\nINFO " + loglines.group_up_line("tp", 0, 2, 0, 0, ["10.0.0.1", "10.0.1.1"], "r2cc-h0",
                                                         ["mgmt0"]) + "\n")
    assert evidence.rail_map_from_logs([str(log)]) == {0: "10.0.0.1", 1: "10.0.1.1"}
