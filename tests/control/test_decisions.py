"""Operator decisions kept per group and host (health/decisions.py): the file, its merging, bad
files, and a real group that starts beside a corrupt one."""

from __future__ import annotations

import json
import logging
import os
import stat

import pytest

from r2cc_serve.health.decisions import REASON_MAX_CHARS, DecisionStore, check_text, state_path
from tests.comm import workers
from tests.comm.harness import run_ranks


def test_a_drain_is_written_private_and_read_back_by_a_new_store_then_cleared(tmp_path):
    state_dir = str(tmp_path / "state")
    first = DecisionStore(state_dir, "tp:0", "node0")
    first.record(1, "drain", "swap cable", "1a2b3c4d")
    path = state_path(state_dir, "tp:0", "node0")
    assert os.path.basename(path) == "tp_0@node0.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and stat.S_IMODE(os.stat(state_dir).st_mode) == 0o700
    doc = json.load(open(path))
    assert doc["format"] == "r2cc-decisions/1" and (doc["group"], doc["host"]) == ("tp:0", "node0")
    assert doc["rails"]["1"]["drain"]["reason"] == "swap cable" and doc["rails"]["1"]["drain"]["by"] == "1a2b3c4d"

    again = DecisionStore(state_dir, "tp:0", "node0")  # what a restarted rank reads
    assert again.by_rail()[1]["drain"] == first.by_rail()[1]["drain"]
    assert DecisionStore(state_dir, "tp:0", "node1").by_rail() == {}  # another host's file
    assert DecisionStore(state_dir, "tp:1", "node0").by_rail() == {}  # another group's file
    again.clear(1, "drain")
    assert json.load(open(path))["rails"] == {} and DecisionStore(state_dir, "tp:0", "node0").by_rail() == {}
    assert [f for f in os.listdir(state_dir) if f.endswith(".tmp")] == []


def test_two_ranks_of_one_host_merge_their_records(tmp_path):
    a = DecisionStore(str(tmp_path), "g", "h")
    b = DecisionStore(str(tmp_path), "g", "h")
    a.record(1, "drain", None, "aaaa0000")
    b.record(2, "failover", "flapping", "bbbb1111")  # b re-reads the file: a's drain is kept
    assert set(DecisionStore(str(tmp_path), "g", "h").by_rail()) == {1, 2}
    a.clear(2, "failover")
    assert DecisionStore(str(tmp_path), "g", "h").by_rail() == {1: {"drain": b.by_rail()[1]["drain"]}}


def test_without_a_state_dir_decisions_live_in_memory_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = DecisionStore(None, "g", "h")
    store.record(0, "drain", "maintenance", "x")
    assert store.by_rail()[0]["drain"]["reason"] == "maintenance" and os.listdir(tmp_path) == []


@pytest.mark.parametrize("content", ["{not json", '{"format": "something-else", "rails": {}}',
                                     '{"format": "r2cc-decisions/1", "group": "g", "host": "h", '
                                     '"rails": {"1": {"drain": {"reason": "a\\nb", "by": "x", "at": 1}}}}',
                                     '{"format": "r2cc-decisions/1", "group": "other", "host": "h", "rails": {}}'])
def test_a_bad_file_is_named_in_an_error_and_gives_no_decisions(tmp_path, caplog, content):
    path = state_path(str(tmp_path), "g", "h")
    with open(path, "w") as f:
        f.write(content)
    with caplog.at_level(logging.ERROR, logger="r2cc_serve.health"):
        store = DecisionStore(str(tmp_path), "g", "h")
    assert store.by_rail() == {}
    assert any(path in r.getMessage() and "remove the file" in r.getMessage() for r in caplog.records), caplog.text
    store.record(3, "drain", None, "x")  # the next decision rewrites it
    assert set(DecisionStore(str(tmp_path), "g", "h").by_rail()) == {3}


def test_a_state_dir_that_cannot_be_made_is_logged_and_decisions_stay_in_memory(tmp_path, caplog):
    (tmp_path / "file").write_text("")
    with caplog.at_level(logging.ERROR, logger="r2cc_serve.health"):
        store = DecisionStore(str(tmp_path / "file" / "state"), "g", "h")
    assert store.path is None and "R2CC_STATE_DIR" in caplog.text
    store.record(0, "failover", None, "x")
    assert 0 in store.by_rail()


def test_reasons_are_one_line_of_plain_text_of_bounded_length():
    assert check_text("swap cable (ticket 42), é ok", REASON_MAX_CHARS, "reason") == "swap cable (ticket 42), é ok"
    assert check_text("", REASON_MAX_CHARS, "reason") is None and check_text(None, REASON_MAX_CHARS, "reason") is None
    assert check_text("x" * REASON_MAX_CHARS, REASON_MAX_CHARS, "reason")
    for bad in ("x" * (REASON_MAX_CHARS + 1), "two\nlines", "tab\there", "nul\x00", "c1\x85", "sep\u2028", 42):
        with pytest.raises(ValueError, match="plain text"):
            check_text(bad, REASON_MAX_CHARS, "reason")


def start_beside_a_corrupt_file(rank, world, store, status_dir, state_dir):
    """Opens the group with R2CC_STATE_DIR holding a corrupt file for rank 0's host, runs an
    all_reduce, and returns the r2cc log lines and the rails' states."""
    import torch

    os.environ.update(R2CC_STATUS_DIR=status_dir, R2CC_STATE_DIR=state_dir)
    lines = capture_r2cc_logs()
    comm = workers.open_comm(rank, world, store, group="broken")
    try:
        x = workers.make_input(rank, 1 << 16, torch.float32)
        want = workers.reference_reduce([workers.make_input(r, 1 << 16, torch.float32) for r in range(world)], "sum")
        exact = workers.bits_equal(comm.all_reduce(x.clone()), want)
        return {"exact": exact, "states": sorted({r["state"] for r in comm.rail_stats()}), "logs": lines}
    finally:
        comm.close()


def capture_r2cc_logs() -> list[str]:
    """Every r2cc_serve log record of this process from now on, as 'LEVEL message'."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(f"{record.levelname} {record.getMessage()}")

    logger = logging.getLogger("r2cc_serve")
    logger.addHandler(Keep())
    logger.setLevel(logging.INFO)
    return lines


def test_a_corrupt_state_file_does_not_stop_the_group(tmp_path):
    state_dir, status_dir = tmp_path / "state", tmp_path / "status"
    state_dir.mkdir(mode=0o700)
    path = state_path(str(state_dir), "broken", "rank0")
    with open(path, "w") as f:
        f.write('{"format": "r2cc-decisions/1", "group": "broken", "ho')  # cut short, as by a full disk
    res = run_ranks(start_beside_a_corrupt_file, 2, str(status_dir), str(state_dir), timeout=90)
    assert all(r["exact"] and r["states"] == ["up"] for r in res), res
    errors = [line for line in res[0]["logs"] if line.startswith("ERROR")]
    assert any(path in line and "remove the file" in line for line in errors), res[0]["logs"]
    assert not [line for line in res[1]["logs"] if line.startswith("ERROR")]  # rank 1's host has no file
