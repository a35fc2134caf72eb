"""Fixed ports (R2CC_PORT_RANGE): every listener a rank opens (one per rail, its control agent)
takes the first free port of the range; a full range is a PortRangeError that says what to do.
Loopback, no root: groups of threads in this process."""

from __future__ import annotations

import contextlib
import datetime
import random
import socket
import threading

import pytest

from r2cc_serve import envs
from r2cc_serve.errors import KnobError, PortRangeError
from tests.comm.harness import run_in_threads

DEFAULT = envs.PortRange(29650, 29749)
RAILS = ["127.0.0.1", "127.0.0.2"]


@pytest.fixture(autouse=True)
def _private_status_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("R2CC_STATUS_DIR", str(tmp_path / "status"))
    monkeypatch.delenv("R2CC_PORT_RANGE", raising=False)
    monkeypatch.delenv("R2CC_CONTROL_HOST", raising=False)
    monkeypatch.delenv("VLLM_HOST_IP", raising=False)


def _store():
    from torch.distributed import HashStore

    store = HashStore()
    store.set_timeout(datetime.timedelta(seconds=60))
    return store


def _addresses(comm) -> list[tuple[str, int]]:
    """Every (address, port) the rank listens on: its rails, then its control agent."""
    host, port = comm.agent.address.rsplit(":", 1)
    return list(zip(comm.rail_ips, comm._t.listen_ports())) + [(host, int(port))]


def _open_groups(groups: int, world: int, rails: list[str]) -> list[list[tuple[str, int]]]:
    """`groups` groups of `world` ranks, all open at once; the addresses of every rank."""
    from r2cc_serve import Communicator

    stores = [_store() for _ in range(groups)]
    everyone_open = threading.Barrier(groups * world, timeout=60)

    def rank_of_group(i):
        g, rank = divmod(i, world)
        with Communicator(rank, world, stores[g], rails=rails, group=f"ports-{g}") as comm:
            everyone_open.wait()
            out = _addresses(comm)
            everyone_open.wait()  # nobody closes before every address was read
            return out

    return run_in_threads(rank_of_group, world=groups * world, timeout=120)


@contextlib.contextmanager
def _held_ports(n: int, address: str = "127.0.0.1"):
    """n consecutive ports below the ephemeral range, outside the default range, held (listening)
    by this test as another program would; yields the first."""
    for _ in range(200):
        first = random.randrange(20000, 29000)
        socks = []
        try:
            for port in range(first, first + n):
                s = socket.socket()
                socks.append(s)
                s.bind((address, port))
                s.listen()
        except OSError:
            for s in socks:
                s.close()
            continue
        try:
            yield first
        finally:
            for s in socks:
                s.close()
        return
    raise RuntimeError(f"no {n} consecutive free ports found")


def _bindable(address: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((address, port))
            return True
        except OSError:
            return False


def test_every_listener_of_a_rank_lands_in_the_default_range():
    assert envs.get("R2CC_PORT_RANGE") == DEFAULT
    for rank in _open_groups(1, 2, RAILS):
        assert len(rank) == len(RAILS) + 1
        for address, port in rank:
            assert DEFAULT.first <= port <= DEFAULT.last, (address, port)


def test_two_groups_on_one_host_get_distinct_ports():
    ranks = [a for rank in _open_groups(2, 2, RAILS) for a in rank]
    assert len(ranks) == 2 * 2 * (len(RAILS) + 1)
    assert len(set(ranks)) == len(ranks), sorted(ranks)
    assert all(DEFAULT.first <= port <= DEFAULT.last for _, port in ranks), sorted(ranks)


def test_a_port_another_program_holds_is_skipped(monkeypatch):
    with _held_ports(1) as held:
        monkeypatch.setenv("R2CC_PORT_RANGE", f"{held}-{held + 2}")
        (rank,) = _open_groups(1, 1, ["127.0.0.1"])
    assert rank == [("127.0.0.1", held + 1), ("127.0.0.1", held + 2)]


def test_zero_keeps_the_kernels_ephemeral_ports(monkeypatch):
    monkeypatch.setenv("R2CC_PORT_RANGE", "0")
    low, high = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    (rank,) = _open_groups(1, 1, RAILS)
    assert all(low <= port <= high for _, port in rank), rank


@pytest.mark.parametrize("listener", ["rail", "agent"])
def test_a_full_range_is_an_error_naming_the_knob_and_the_way_out(monkeypatch, listener):
    """Two ports, both held by this test. For the rails: rail 0 on 127.0.0.2 gets one, rail 1 on
    127.0.0.1 none; for the agent: the rail (127.0.0.2) gets one, the agent (127.0.0.1) none.
    Either way the ports the rank had taken are given back."""
    from r2cc_serve import Communicator

    rails = ["127.0.0.2", "127.0.0.1"] if listener == "rail" else ["127.0.0.2"]
    monkeypatch.setenv("R2CC_CONTROL_HOST", "127.0.0.1")
    with _held_ports(2) as first:
        monkeypatch.setenv("R2CC_PORT_RANGE", f"{first}-{first + 1}")
        with pytest.raises(PortRangeError) as caught:
            Communicator(0, 1, _store(), rails=rails, group=f"full-{listener}")
        assert _bindable("127.0.0.2", first), "the port the rank took was not given back"
    msg = str(caught.value)
    what = "a rail on 127.0.0.1" if listener == "rail" else "the control agent on 127.0.0.1"
    assert msg.startswith(f"R2CC_PORT_RANGE={first}-{first + 1}: no free port for {what}: all 2 are in use"), msg
    assert "widen R2CC_PORT_RANGE" in msg and "R2CC_PORT_RANGE=0" in msg and "\n" not in msg


@pytest.mark.parametrize("value", ["abc", "70000-1", "100-90", "29650", "-5"])
def test_a_malformed_range_is_a_one_line_knob_error(monkeypatch, value):
    from r2cc_serve import Communicator

    monkeypatch.setenv("R2CC_PORT_RANGE", value)
    with pytest.raises(KnobError) as caught:
        envs.get("R2CC_PORT_RANGE")
    msg = str(caught.value)
    assert msg.startswith(f"R2CC_PORT_RANGE={value!r} is not valid (expected FIRST-LAST") and "\n" not in msg
    with pytest.raises(KnobError, match="R2CC_PORT_RANGE"):  # before any socket is opened
        Communicator(0, 1, _store(), rails=["127.0.0.1"], group=f"bad-{value}")


def test_the_range_reads_as_written():
    assert str(DEFAULT) == "29650-29749" and str(envs.PortRange(0, 0)) == "0"
    assert envs._port_range(" 1024 - 1024 ") == (1024, 1024)
