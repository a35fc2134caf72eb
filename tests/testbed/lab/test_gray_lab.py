"""Gray and marginal rails against the real kernel: small packets pass, large ones do not, in
exactly the direction asked, and clear brings full-size packets back.

Probes are one-way UDP datagrams of a chosen IP packet length (an echo would cross the rail
both ways), sent with the don't-fragment bit. Own prefix (r2ccgy) and state file, so it runs
beside the other test labs.
"""

from __future__ import annotations

import json
import select
import socket
import time

import pytest

from r2cc_serve.cli import main as cli_main
from r2cc_testbed.faults.model import parse_fault_text
from r2cc_testbed.lab import netns
from r2cc_testbed.lab.ping import socket_in_netns
from r2cc_testbed.lab.session import lab_session

pytestmark = [pytest.mark.lab, pytest.mark.timeout(120), pytest.mark.requires("root", "ip", "tc", "nft")]

PREFIX = "r2ccgy"
STATE = f"/run/r2cc-lab/{PREFIX}-state.json"
SMALL, LARGE = 200, 1400  # IP packet lengths, headers included
SENT = 3
IP_MTU_DISCOVER, IP_PMTUDISC_DO = 10, 2  # linux/in.h: set the don't-fragment bit


@pytest.fixture
def lab():
    with lab_session(2, 4, None, prefix=PREFIX, state=STATE) as lab:
        yield lab


def arrived(lab, src: int, dst: int, rail: int, ip_bytes: int, count: int = SENT, wait_s: float = 0.2) -> int:
    """How many of `count` UDP datagrams, each an IP packet of ip_bytes, sent from host src to
    host dst's address on rail, arrive there (waiting wait_s after the last one)."""
    dst_ip = lab.rail_ip(dst, rail)
    with socket_in_netns(lab.host_ns(dst), socket.AF_INET, socket.SOCK_DGRAM) as rx, \
            socket_in_netns(lab.host_ns(src), socket.AF_INET, socket.SOCK_DGRAM) as tx:
        rx.bind((dst_ip, 0))
        tx.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
        for _ in range(count):
            tx.sendto(b"x" * (ip_bytes - 28), (dst_ip, rx.getsockname()[1]))  # 20 IP + 8 UDP header bytes
        got, deadline = 0, time.monotonic() + wait_s
        while got < count and select.select([rx], [], [], max(0.0, deadline - time.monotonic()))[0]:
            assert len(rx.recv(65535)) == ip_bytes - 28
            got += 1
        return got


def both_ways(lab, rail: int, ip_bytes: int) -> tuple[int, int]:
    """(datagrams host 0 -> host 1, host 1 -> host 0) that arrived of SENT each way."""
    return arrived(lab, 0, 1, rail, ip_bytes), arrived(lab, 1, 0, rail, ip_bytes)


def recorded(lab) -> list[dict]:
    return lab.status()["faults"]


def link(lab, host: int, rail: int) -> dict:
    return next(x for x in lab.status()["links"] if (x["host"], x["rail"]) == (host, rail))


def tables(lab) -> list[str]:
    return [name for h in range(lab.hosts) for _, name in netns.nft_tables(lab.host_ns(h))]


def lab_cli(capsys, *args: str) -> tuple[int, str, str]:
    """`r2cc lab ARGS` in this process (the lab's env is set by the caller): exit code, stdout, stderr."""
    code = cli_main(["lab", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


# notation -> (large packets host 0 -> host 1 arrive, host 1 -> host 0 arrive), of SENT each way
GRAY = {"h0:1:gray": (0, 0), "h0:1:gray:out": (0, SENT), "h0:1:gray:in": (SENT, 0)}


@pytest.mark.parametrize("notation", GRAY)
def test_gray_drops_large_packets_in_the_direction_asked_and_clear_restores(lab, notation):
    spec = parse_fault_text(notation)
    lab.inject(spec)
    lab.inject(spec)  # idempotent
    assert both_ways(lab, 1, SMALL) == (SENT, SENT), "small packets pass both ways"
    assert both_ways(lab, 1, LARGE) == GRAY[notation]
    assert both_ways(lab, 2, LARGE) == (SENT, SENT), "other rails are untouched"
    assert link(lab, 0, 1)["gray"] == spec.direction and link(lab, 0, 1)["link_up"]
    assert recorded(lab) == [{"host": 0, "rail": 1, "kind": "gray",
                              "arg": {"direction": spec.direction, "max_bytes": 1000}}]
    for _ in range(2):  # idempotent
        lab.inject(parse_fault_text("h0:1:clear"))
    assert both_ways(lab, 1, LARGE) == (SENT, SENT)
    assert recorded(lab) == [] and link(lab, 0, 1)["gray"] is None
    assert not any("gray" in name for name in tables(lab))


def test_bytes_is_the_ip_packet_length_and_a_new_direction_replaces_the_old(lab):
    lab.fault(0, 1, "gray", ("in", 600))
    assert arrived(lab, 1, 0, 1, 600) == SENT and arrived(lab, 1, 0, 1, 601) == 0, "longer than 600 is dropped"
    assert arrived(lab, 0, 1, 1, LARGE) == SENT
    lab.fault(0, 1, "gray", "out")  # replaced, not added to
    assert both_ways(lab, 1, LARGE) == (0, SENT) and link(lab, 0, 1)["gray"] == "out"
    assert [f["arg"] for f in recorded(lab)] == [{"direction": "out", "max_bytes": 1000}]


def test_marginal_drops_a_share_of_the_large_packets_only(lab):
    lab.inject(parse_fault_text("h0:1:marginal:50:in"))
    assert both_ways(lab, 1, SMALL) == (SENT, SENT)
    assert arrived(lab, 0, 1, 1, LARGE) == SENT, "in: what host 0 sends is untouched"
    got = arrived(lab, 1, 0, 1, LARGE, count=60)
    assert 10 <= got <= 50, got  # half of 60, drawn at random
    assert arrived(lab, 1, 0, 1, SMALL, count=60) == 60
    assert link(lab, 0, 1)["marginal"] == "in" and link(lab, 1, 1)["marginal"] is None
    lab.inject(parse_fault_text("h0:1:marginal:100"))  # a dead optic for large frames, both ways
    assert both_ways(lab, 1, LARGE) == (0, 0) and both_ways(lab, 1, SMALL) == (SENT, SENT)
    assert [f["arg"] for f in recorded(lab)] == [{"loss_pct": 100.0, "direction": "both", "max_bytes": 1000}]
    lab.inject(parse_fault_text("h0:1:clear"))
    assert both_ways(lab, 1, LARGE) == (SENT, SENT) and recorded(lab) == []
    assert not any("marginal" in name for name in tables(lab))


def test_a_gray_rail_connects_but_moves_no_data(lab):
    """TCP's handshake is small and passes; its full-size segments do not, until the clear."""
    lab.inject(parse_fault_text("h0:1:gray"))
    assert tcp_bytes(lab, 1, DATA, within_s=0.5) == 0
    lab.inject(parse_fault_text("h0:1:clear"))
    assert tcp_bytes(lab, 1, DATA, within_s=5.0) == DATA


DATA = 128 * 1024  # fits the sender's socket buffer: sendall returns whether or not it moves


def tcp_bytes(lab, rail: int, size: int, within_s: float) -> int:
    """Bytes of size that a new TCP connection from host 0 to host 1 on rail delivers within within_s."""
    with socket_in_netns(lab.host_ns(1), socket.AF_INET, socket.SOCK_STREAM) as srv, \
            socket_in_netns(lab.host_ns(0), socket.AF_INET, socket.SOCK_STREAM) as cli:
        srv.bind((lab.rail_ip(1, rail), 0))
        srv.listen(1)
        cli.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * size)
        cli.settimeout(within_s)
        cli.connect(srv.getsockname())
        conn, _ = srv.accept()
        cli.sendall(b"x" * size)
        got, deadline = 0, time.monotonic() + within_s
        with conn:
            while got < size and select.select([conn], [], [], max(0.0, deadline - time.monotonic()))[0]:
                got += len(conn.recv(65536))
        return got


def test_switched_lab_drops_at_the_switch_port():
    """With three hosts a rail's far end is the host's switch port: `out` drops there."""
    with lab_session(3, 2, None, prefix=PREFIX, state=STATE) as lab:
        lab.inject(parse_fault_text("h2:1:gray:out"))
        assert arrived(lab, 2, 0, 1, LARGE) == 0 and arrived(lab, 0, 2, 1, LARGE) == SENT
        assert arrived(lab, 2, 0, 1, SMALL) == SENT and arrived(lab, 1, 0, 1, LARGE) == SENT
        assert any(name.endswith("_gray_h2_rail1") for _, name in netns.nft_tables(lab.switch_ns))
        assert link(lab, 2, 1)["gray"] == "out"
        lab.inject(parse_fault_text("h2:1:clear"))
        assert arrived(lab, 2, 0, 1, LARGE) == SENT and lab.status()["faults"] == []


def test_cli_words_status_and_clear(lab, capsys, monkeypatch):
    monkeypatch.setenv("R2CC_LAB_PREFIX", PREFIX)
    monkeypatch.setenv("R2CC_LAB_STATE", STATE)
    code, out, err = lab_cli(capsys, "fault", "h0", "1", "gray", "out", "600")
    assert code == 0 and out == f"{PREFIX}-h0 rail1: gray out >600 B\n", err
    code, out, _ = lab_cli(capsys, "status")
    assert json.loads(out)["faults"] == [{"host": 0, "rail": 1, "kind": "gray",
                                          "arg": {"direction": "out", "max_bytes": 600}}]
    assert arrived(lab, 0, 1, 1, 600) == SENT and arrived(lab, 0, 1, 1, 601) == 0
    assert arrived(lab, 1, 0, 1, LARGE) == SENT
    for bad, message in [("sideways", "gray direction 'sideways' is not valid: use both, out or in"),
                         ("1500", "gray drops IP packets longer than 1500 bytes, and the lab's rails (MTU 1500)")]:
        code, _, err = lab_cli(capsys, "fault", "h0", "1", "gray", bad)
        assert code == 2 and message in err and "Traceback" not in err, err
    assert lab_cli(capsys, "fault", "h0", "1", "clear")[0] == 0
    assert arrived(lab, 0, 1, 1, LARGE) == SENT and lab.status()["faults"] == []
