"""The responder and the checker against each other on loopback (no root): 127.0.0.1-2 are
"this host's" rails, 127.0.0.3-4 the peer's."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from r2cc_serve.doctor import checks, netinfo, wire
from r2cc_serve.doctor.probes import Control
from r2cc_serve.doctor.rails import Peer, resolve_rails
from r2cc_serve.doctor.responder import Responder
from r2cc_serve.errors import UserError

PEER = Peer("127.0.0.3", ("127.0.0.3", "127.0.0.4"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.3", 0))
        return s.getsockname()[1]


@pytest.fixture
def rails():
    return resolve_rails(["127.0.0.1", "127.0.0.2"], netinfo.interfaces())


@pytest.fixture
def responder():
    for _ in range(5):  # a port found free may be taken before we bind it: try another
        try:
            r = Responder(list(PEER.addrs), free_port())
            break
        except UserError:
            continue
    thread = threading.Thread(target=r.serve_forever, daemon=True)
    thread.start()
    yield r
    r.stop()
    thread.join(5)
    r.close()


def test_every_check_passes_on_loopback(rails, responder):
    report = checks.run("test", rails, [PEER], responder.port, bandwidth_s=0)
    assert [p.line() for p in report.problems] == [] and report.exit_code == 0
    for res in report.pairs:
        assert res.cells == {"port": "ok", "path": "ok", "mtu": str(rails[0].iface.mtu), "bandwidth": "-"}
        assert res.facts.routed.fields["arrived"] == "lo" and res.facts.hello["rails"] == ["lo", "lo"]
    assert [s.name for s in report.settings["here"]] == [s.name for s in report.settings["127.0.0.3"]]


def test_bandwidth_is_measured_each_way(rails, responder):
    report = checks.run("test", rails, [PEER], responder.port, bandwidth_s=0.1)
    for res in report.pairs:
        assert res.facts.mbit_out > 0 and res.facts.mbit_in > 0, res.facts
    # A busy 2-core host may slow one short probe; nothing else may be flagged.
    assert [p.line() for p in report.problems if "Mbit/s" not in p.what] == []


def test_a_peer_not_running_the_responder_is_one_line_within_seconds(rails):
    port = free_port()
    started = time.monotonic()
    report = checks.run("test", rails, [PEER], port, bandwidth_s=0.2)
    took = time.monotonic() - started
    print(f"[doctor] peer without a responder reported in {took:.2f} s")
    assert [p.line() for p in report.problems] == [
        f"peer 127.0.0.3: not answering on port {port} (connection refused on every rail); "
        "fix: start `r2cc doctor --serve` there"]
    assert took < 15, "every wait has a timeout of a second or two"


def test_the_responder_survives_nonsense(responder):
    with socket.create_connection(("127.0.0.3", responder.port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        s.settimeout(5)
        assert s.recv(100) == b""  # closed: not a doctor
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(wire.MAGIC + b"{not json\n", ("127.0.0.3", responder.port))
    with Control("127.0.0.1", "127.0.0.3", responder.port, 5) as ctrl:
        assert ctrl.hello(["127.0.0.3", "not-an-address"])["rails"] == ["lo", None]
        assert ctrl.ask({"op": "reboot"}) == {"error": "unknown op 'reboot'"}
