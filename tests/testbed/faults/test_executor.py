"""The fault executors, with fake runners that record every command: one kind-to-action map for
both, and apply/clear idempotent. Pure (nothing reaches the kernel)."""

from __future__ import annotations

import subprocess

import pytest

from r2cc_testbed.faults import inprocess_executor
from r2cc_testbed.faults.executor import FaultExecutor
from r2cc_testbed.faults.inprocess_executor import InProcessExecutor
from r2cc_testbed.faults.lab_executor import LabExecutor, LabRecord
from r2cc_testbed.faults.model import parse_fault_text
from r2cc_testbed.lab import netns, state
from r2cc_testbed.lab.layout import Layout
from r2cc_testbed.lab.netns import LabError

LAYOUT = Layout("r2ccut", 2, 4)
LAB_RATE = "1gbit"
KINDS = ["h0:1:down", "h0:1:up", "h0:1:blackhole", "h0:1:degrade:100mbit", "h0:1:lossy:1", "h0:1:gray:out:600",
         "h0:1:marginal:90:in", "h1:all-down", "h0:1:clear"]


class CommandLog:
    """Stands in for netns.run: records each command (with the nft script it is given) and answers
    as a lab with no qdisc or table would."""

    def __init__(self):
        self.commands: list[tuple] = []

    def __call__(self, argv, *, stdin=None, check=True):
        self.commands.append((tuple(argv), stdin))
        return subprocess.CompletedProcess(argv, 0, stdout="", stderr="")

    def take(self) -> list[tuple]:
        out, self.commands = self.commands, []
        return out


@pytest.fixture
def lab_executor(monkeypatch, tmp_path):
    log = CommandLog()
    monkeypatch.setattr(netns, "run", log)
    path = str(tmp_path / "state.json")
    state.write({"id": "lab1", "faults": {}}, path)
    executor = LabExecutor(LAYOUT, LAB_RATE, 1500, LabRecord(path, "lab1"))
    return executor, log, path


def _faults(path):
    return state.read(path)["faults"]


@pytest.mark.parametrize("text", KINDS)
def test_lab_apply_twice_is_apply_once(lab_executor, text):
    executor, log, path = lab_executor
    executor.apply(parse_fault_text(text))
    first, recorded = log.take(), _faults(path)
    executor.apply(parse_fault_text(text))
    assert first and log.take() == first  # the same commands, each of which sets or replaces
    assert _faults(path) == recorded


def test_lab_commands_of_each_kind(lab_executor):
    executor, log, path = lab_executor
    executor.apply(parse_fault_text("h0:1:down"))
    assert log.take() == [(("ip", "-n", "r2ccut-h0", "link", "set", "rail1", "down"), None)]
    assert _faults(path) == {"0/1": {"down": True}}
    executor.apply(parse_fault_text("h0:2:degrade:100mbit"))
    assert [argv[:6] for argv, _ in log.take()] == [("tc", "-n", "r2ccut-h0", "qdisc", "replace", "dev"),
                                                    ("tc", "-n", "r2ccut-h1", "qdisc", "replace", "dev")]
    executor.apply(parse_fault_text("h1:all-down"))
    assert [argv[2] + " " + argv[5] + " " + argv[6] for argv, _ in log.take()] == \
        [f"r2ccut-h1 rail{k} down" for k in range(4)]


def test_lab_clear_twice_and_clear_without_apply(lab_executor):
    executor, log, path = lab_executor
    executor.clear(0, 3)  # nothing in place: harmless
    never_applied = log.take()
    assert ("ip", "-n", "r2ccut-h0", "link", "set", "rail3", "up") in [argv for argv, _ in never_applied]
    assert all("delete table" in script for argv, script in never_applied if argv[-3:] == ("nft", "-f", "-"))
    executor.apply(parse_fault_text("h0:3:lossy:1"))
    executor.apply(parse_fault_text("h0:3:down"))
    log.take()
    executor.clear(0, 3)
    first = log.take()
    assert _faults(path) == {}
    executor.clear(0, 3)
    assert log.take() == first == never_applied


def test_lab_flap_ends_up_and_is_forgotten(lab_executor, monkeypatch):
    executor, log, path = lab_executor
    said = []
    executor._say = said.append
    executor.apply(parse_fault_text("h0:1:flap:4:2"))
    assert [argv[-1] for argv, _ in log.take()] == ["down", "up", "down", "up"]
    assert said == ["flap 1/2: h0 rail1 down", "flap 1/2: h0 rail1 up", "flap 2/2: h0 rail1 down",
                    "flap 2/2: h0 rail1 up"]
    assert _faults(path) == {}


def test_lab_flap_stops_when_the_lab_is_torn_down(lab_executor):
    executor, log, path = lab_executor
    state.remove(path)
    with pytest.raises(LabError, match="torn down"):
        executor.apply(parse_fault_text("h0:1:flap:4:2"))
    assert log.take() == []


def test_admin_actions_are_no_lab_fault(lab_executor):
    executor, log, _ = lab_executor
    with pytest.raises(LabError, match="not a lab fault"):
        executor.apply(parse_fault_text("h0:1:drain"))
    assert log.take() == []


# --- the in-process executor, its sockets, nftables contexts and tc sessions faked ------------------

class FakeLinks:
    def __init__(self, log):
        self.log, self.up = log, {}

    def set_up(self, ns, dev, up):
        self.log.append(("link", ns, dev, up))
        self.up[(ns, dev)] = up

    def carrier(self, ns, dev):
        # a veth has a carrier while both its ends are up; with two hosts both ends are railK
        return all(self.up.get((LAYOUT.host_ns(i), dev), True) for i in range(LAYOUT.hosts))


class FakeNft:
    def __init__(self, log):
        self.log = log

    def run(self, ns, script):
        self.log.append(("nft", ns, script))


class FakeTc:
    def __init__(self, log):
        self.log = log

    def set_rate(self, layout, host, rail, rate):
        self.log.append(("tc", host, rail, rate))


@pytest.fixture
def in_process(monkeypatch):
    log: list[tuple] = []
    monkeypatch.setattr(inprocess_executor, "LinkSwitch", lambda namespaces: FakeLinks(log))
    monkeypatch.setattr(inprocess_executor, "NftInNamespaces", lambda namespaces: FakeNft(log))
    monkeypatch.setattr(inprocess_executor, "TcSessions", lambda namespaces: FakeTc(log))
    return InProcessExecutor(LAYOUT, LAB_RATE, 1500), log


def _take(log):
    out = list(log)
    log.clear()
    return out


@pytest.mark.parametrize("text", KINDS)
def test_in_process_apply_twice_is_apply_once(in_process, text):
    executor, log = in_process
    executor.apply(parse_fault_text(text))
    first = _take(log)
    executor.apply(parse_fault_text(text))
    assert first and _take(log) == first


def test_in_process_clear_twice_and_clear_without_apply(in_process):
    executor, log = in_process
    executor.clear(0, 2)
    never_applied = _take(log)
    assert ("link", "r2ccut-h0", "rail2", True) in never_applied
    assert not [c for c in never_applied if c[0] == "tc"]  # a rail it never degraded keeps its shaping
    executor.apply(parse_fault_text("h0:2:degrade:100mbit"))
    assert _take(log) == [("tc", 0, 2, "100mbit")]
    executor.clear(0, 2)
    assert _take(log) == never_applied + [("tc", 0, 2, LAB_RATE)]
    executor.clear(0, 2)
    assert _take(log) == never_applied


def test_in_process_checks_watch_the_kernel(in_process):
    executor, _ = in_process
    check = executor.apply(parse_fault_text("h1:all-down"))
    assert check() and executor.clear(1, 0)()  # the peer lost its carrier; ours is back


@pytest.mark.parametrize("text", KINDS)
def test_both_executors_write_the_same_nftables_scripts(lab_executor, in_process, text):
    lab, commands, _ = lab_executor
    inproc, log = in_process
    lab.apply(parse_fault_text(text))
    inproc.apply(parse_fault_text(text))
    by_command = [(argv[3], script) for argv, script in commands.take() if argv[-3:] == ("nft", "-f", "-")]
    assert by_command == [(ns, script) for kind, ns, script in (c for c in log if c[0] == "nft")]


def test_every_executor_is_one_interface():
    for cls in (LabExecutor, InProcessExecutor):
        assert issubclass(cls, FaultExecutor)
        assert cls.apply is FaultExecutor.apply and cls.clear is FaultExecutor.clear  # one dispatch


def test_in_process_flap_is_timed_by_the_schedule(in_process):
    executor, log = in_process
    executor.apply(parse_fault_text("h0:2:flap:4:2"))
    assert _take(log) == [("link", "r2ccut-h0", "rail2", up) for up in (False, True, False, True)]
