"""The rail monitor rewrites its status file at once for a state change, and only now and then for
counters alone (each rewrite costs a rank CPU beside its collectives); between those it does not
even take a full sample, only the cheap state signature. The communicator is a fake with the same
read-only surface; the monitor, its thread and the file are real."""

import json
import os
import threading
import time

from r2cc_serve.health.monitor import RailMonitor


class FakeComm:
    """`calls` moves with traffic (a thread of the fake's own), `samples` counts full samples
    (rail_stats) and `checks` the monitor's cheap signature reads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.state = "up"
        self.calls = self.samples = self.checks = 0
        self._interrupted = threading.Event()
        self._stop = threading.Event()
        threading.Thread(target=self._traffic, daemon=True).start()

    def _traffic(self):
        while not self._stop.wait(0.005):
            with self.lock:
                self.calls += 1

    def stop_traffic(self):
        self._stop.set()

    def rail_stats(self):
        with self.lock:
            self.samples += 1
            return [{"peer": 1, "rail": r, "address": f"10.0.{r}.1", "state": self.state if r == 0 else "up",
                     "last_error": "", "hold_reason": "", "last_detect_s": 0.0, "fallback": False,
                     "bytes_sent": self.calls * 4096, "failovers": 0} for r in range(2)]

    def peer_stats(self):
        return [{"peer": 1, "stalled": False, "closed": False}]

    def error(self):
        return ""

    def state_signature(self):
        with self.lock:
            self.checks += 1
            return self.state

    def wait_state_change(self, seen, poll_s, timeout_s, watch_path="", watch_since_ns=0):
        # as the transport's: look every poll_s until something moved or the time is up
        deadline = time.monotonic() + timeout_s
        while True:
            now = self.state_signature()
            try:
                asked = bool(watch_path) and os.stat(watch_path).st_mtime_ns >= watch_since_ns
            except OSError:
                asked = False
            if now != seen or asked or self._interrupted.is_set() or time.monotonic() >= deadline:
                self._interrupted.clear()
                return now
            self._interrupted.wait(min(poll_s, max(0.0, deadline - time.monotonic())))

    def interrupt_state_wait(self):
        self._interrupted.set()

    def error_kind(self):
        return ""

    def counters(self):
        with self.lock:
            return {"calls": self.calls}

    def plan_info(self):
        return {}

    def duration_histogram(self):
        return {}


def _watch_writes(monitor):
    writes = []
    real = monitor._write

    def counted(snap, *key):
        real(snap, *key)
        writes.append(time.monotonic())
    monitor._write = counted
    return writes


def _wait(pred, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return False


def test_counters_alone_wait_for_the_refresh_a_state_change_is_written_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("R2CC_STATUS_REFRESH_MS", "600")
    comm = FakeComm()
    monitor = RailMonitor(comm, "g", 0, 0, str(tmp_path), 0.01, "h0", state_dir="")
    writes = _watch_writes(monitor)
    path = os.path.join(str(tmp_path), "g-rank0.json")
    monitor.start()
    try:
        assert os.path.exists(path)  # written at start
        checks, samples = comm.checks, comm.samples
        time.sleep(0.3)  # ~30 checks, the counters changing all the while
        assert comm.checks - checks >= 10, "the monitor did not check the state"
        assert comm.samples - samples <= 1, f"{comm.samples - samples} full samples in 0.3 s with only counters changing"
        assert len(writes) <= 2, f"{len(writes)} writes in 0.3 s with only counters changing"

        with comm.lock:
            comm.state = "down"
            calls_at_change = comm.calls
        t0 = time.monotonic()
        assert _wait(lambda: json.load(open(path))["rails"][0]["state"] == "down", 2.0)
        assert time.monotonic() - t0 < 0.5, "a state change waited for the periodic refresh"

        # counters alone still reach the file, once per refresh period
        n = len(writes)
        assert _wait(lambda: len(writes) > n, 2.0)
        calls_in_file = json.load(open(path))["counters"]["calls"]
        assert calls_in_file > calls_at_change
    finally:
        monitor.stop()
        comm.stop_traffic()
    assert not os.path.exists(path)


def test_an_operator_refresh_always_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("R2CC_STATUS_REFRESH_MS", "60000")
    comm = FakeComm()
    comm.stop_traffic()  # the file must show the counters as they are
    monitor = RailMonitor(comm, "g", 1, 0, str(tmp_path), 10.0, "h0", state_dir="")
    writes = _watch_writes(monitor)
    monitor.refresh_now()
    monitor.refresh_now()
    assert len(writes) == 2
    doc = json.load(open(os.path.join(str(tmp_path), "g-rank1.json")))
    assert doc["counters"]["calls"] == comm.calls


def test_a_reader_asking_for_fresh_counters_gets_them_at_the_next_sample(tmp_path, monkeypatch):
    # Byte totals after a short load must be the load's, not up to a refresh period old.
    from r2cc_testbed.serving.evidence import read_status_now

    monkeypatch.setenv("R2CC_STATUS_REFRESH_MS", "60000")
    comm = FakeComm()
    monitor = RailMonitor(comm, "g", 0, 0, str(tmp_path), 0.02, "h0", state_dir="")
    monitor.start()
    try:
        in_file = json.load(open(os.path.join(str(tmp_path), "g-rank0.json")))["counters"]["calls"]
        time.sleep(0.2)  # traffic moves the counters; the file keeps its start-up value
        assert json.load(open(os.path.join(str(tmp_path), "g-rank0.json")))["counters"]["calls"] == in_file
        calls_asked = comm.calls
        t0 = time.monotonic()
        docs = read_status_now(str(tmp_path))
        assert time.monotonic() - t0 < 1.0
        assert docs["g-rank0.json"]["counters"]["calls"] >= calls_asked > in_file
    finally:
        monitor.stop()
        comm.stop_traffic()


def test_a_status_dir_that_cannot_be_made_costs_the_file_not_the_rank(tmp_path, caplog):
    (tmp_path / "a-file").write_text("")
    comm = FakeComm()
    try:
        monitor = RailMonitor(comm, "g", 0, 0, str(tmp_path / "a-file" / "status"), 0.01, "h0", state_dir="")
        monitor.start()
        assert monitor.status_path is None
        monitor.stop()
    finally:
        comm.stop_traffic()
    assert "R2CC_STATUS_DIR" in caplog.text and "writes no status file" in caplog.text


def test_the_default_status_dir_is_the_deployments_and_not_in_tmp(tmp_path, monkeypatch):
    """A systemd unit's RuntimeDirectory= first (one per unit), then /run for root, the user's
    runtime directory, the user's cache; the knob wins over all of them."""
    from r2cc_serve import envs

    monkeypatch.delenv("R2CC_STATUS_DIR", raising=False)
    monkeypatch.setenv("RUNTIME_DIRECTORY", "/run/r2cc/llama:/run/other")
    assert envs.get("R2CC_STATUS_DIR") == "/run/r2cc/llama/r2cc-status"
    monkeypatch.delenv("RUNTIME_DIRECTORY")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert envs.get("R2CC_STATUS_DIR") == "/run/r2cc/status"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert envs.get("R2CC_STATUS_DIR") == "/run/user/1000/r2cc/status"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert envs.get("R2CC_STATUS_DIR") == str(tmp_path / ".cache" / "r2cc" / "status")
    monkeypatch.setenv("R2CC_STATUS_DIR", str(tmp_path / "mine"))
    assert envs.get("R2CC_STATUS_DIR") == str(tmp_path / "mine")


def test_each_sample_says_when_it_was_taken_and_is_numbered():
    """Readers (the admin view) tell a sample's age from `time` and an older sample from a newer
    one by `seq`, whatever the wall clock does."""
    comm = FakeComm()
    comm.stop_traffic()
    monitor = RailMonitor(comm, "g", 0, 0, None, 10.0, "h0", state_dir="")
    first, second = monitor.refresh_now(), monitor.refresh_now()
    assert second["seq"] > first["seq"] and first["time"] <= second["time"] <= time.time()
    assert monitor.snapshot() is second
    # A group rebuilt in the same process (vLLM's fault tolerance) gets a new monitor, whose samples
    # must still read as newer: the view keeps a rank's newest sample of the same process (a CI
    # failure: health stayed "degraded" with the outage's sample after the rails came back).
    again = RailMonitor(comm, "g", 0, 0, None, 10.0, "h0", state_dir="").refresh_now()
    assert again["process"] == second["process"] and again["seq"] > second["seq"]
