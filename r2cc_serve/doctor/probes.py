"""The checker's side of each probe: what crossed, what did not, and how it failed.

Every probe starts from a rail's address, as r2cc's transport does (csrc/net.cc connect_to
binds the address and nothing else); the device-bound UDP probe also pins the rail's interface
(SO_BINDTODEVICE). Every wait has a timeout. A failure is a ProbeError whose kind says what the
kernel saw: refused (nothing listens: a reset or ICMP port unreachable), timeout (silence: a
firewall drop or a dead path), unreachable (no route, or ARP failed), blocked (this host's own
firewall: EPERM), or error.
"""

from __future__ import annotations

import errno
import select
import socket
import time
from dataclasses import dataclass
from typing import Callable

from r2cc_serve.doctor import wire


class ProbeError(Exception):
    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


def _kind(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timeout"
    if isinstance(exc, OSError) and exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EHOSTDOWN,
                                                  errno.ENETDOWN):
        return "unreachable"
    if isinstance(exc, OSError) and exc.errno in (errno.EPERM, errno.EACCES):
        return "blocked"
    return "error"


def _fail(exc: BaseException, what: str) -> ProbeError:
    reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return ProbeError(_kind(exc), f"{what}: {reason}")


def tcp_connect(src: str, dst: str, port: int, timeout_s: float) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((src, 0))
        sock.settimeout(timeout_s)
        sock.connect((dst, port))
        return sock
    except OSError as exc:
        sock.close()
        raise _fail(exc, f"tcp {src} -> {dst}:{port}") from None


class _Socket:
    """One socket of a probe, closed with the probe (a `with` block or close())."""

    _sock: socket.socket

    def close(self) -> None:
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Control(_Socket):
    """A control connection to a peer's responder, from one rail's address."""

    def __init__(self, src: str, dst: str, port: int, timeout_s: float):
        self.src, self.dst, self.timeout_s = src, dst, timeout_s
        self._sock = tcp_connect(src, dst, port, timeout_s)

    def ask(self, request: dict, timeout_s: float | None = None) -> dict:
        try:
            wire.send_line(self._sock, request)
            return wire.recv_line(self._sock, timeout_s or self.timeout_s)
        except (OSError, TimeoutError, ConnectionError) as exc:
            raise _fail(exc, f"{request.get('op')} from {self.dst}") from None

    def hello(self, peer_rails: list[str]) -> dict:
        """The responder's host name, its interfaces holding peer_rails, its route back to us and
        its kernel settings."""
        return self.ask({"op": "hello", "rails": peer_rails})

    def bandwidth(self, to_peer: bool, seconds: float) -> float:
        """Mbit/s of one TCP stream for `seconds`, measured by the receiver, on an ephemeral port
        the responder opens on its rail address (as r2cc's transport listens)."""
        port = self.ask({"op": "data"}).get("port")
        if not isinstance(port, int):
            raise ProbeError("error", f"{self.dst} opened no data port")
        try:
            data = tcp_connect(self.src, self.dst, port, self.timeout_s)
        except ProbeError as exc:
            raise ProbeError("data_port", f"ephemeral port {port}: {exc.kind}") from None
        with data:
            try:
                wire.send_line(data, {"dir": "to_peer" if to_peer else "from_peer", "ms": int(seconds * 1000)})
                return _send_for(data, seconds, self.timeout_s) if to_peer else _receive_all(data, seconds)
            except (OSError, TimeoutError, ConnectionError) as exc:
                raise _fail(exc, f"bandwidth with {self.dst}") from None


def _send_for(sock: socket.socket, seconds: float, timeout_s: float) -> float:
    wire.recv_line(sock, timeout_s)  # "ready"
    wire.stream_for(sock, seconds, timeout_s)
    counted = wire.recv_line(sock, seconds + 5 + timeout_s)
    return _mbit(counted.get("bytes", 0), counted.get("seconds", 0))


def _receive_all(sock: socket.socket, seconds: float) -> float:
    counted = wire.count_stream(sock, seconds + 5)
    return _mbit(counted["bytes"], counted["seconds"])


def _mbit(nbytes, seconds) -> float:
    try:
        return nbytes * 8 / seconds / 1e6 if seconds > 0 else 0.0
    except TypeError:
        return 0.0


# --- UDP: path and MTU ----------------------------------------------------------------------

@dataclass(frozen=True)
class Reply:
    fields: dict      # what the responder said (arrived, holder, mtu, got, ...)
    arrived: int      # the interface index it arrived by here
    size: int         # its size as an IPv4 packet


class Udp(_Socket):
    """A UDP socket from a rail's address to a peer's responder (device: pinned to an interface)."""

    SMALL = 256  # size of a path probe: far below any MTU

    def __init__(self, src: str, dst: str, port: int, device: str | None = None):
        self.dst, self.port = dst, port
        try:
            self._sock = wire.udp_socket(device)
        except OSError as exc:
            raise _fail(exc, f"udp socket on {device}") from None
        try:
            self._sock.bind((src, 0))
            self._sock.connect((dst, port))  # connected: ICMP port unreachable comes back as ECONNREFUSED
        except OSError as exc:
            self._sock.close()
            raise _fail(exc, f"udp {src} -> {dst}:{port}") from None
        self._seq = 0

    def exchange(self, probes: list[tuple[int, int]], mode: str, wait_s: float,
                 resend_s: float | None = None) -> dict[int, Reply]:
        """Send (size, reply_size) probes at once; the replies that came within wait_s, by index.

        resend_s: send the unanswered ones again after this long (a path probe must not fail
        on one datagram lost to a busy host). Raises ProbeError if nothing can be sent or the
        peer's kernel says the port is closed.
        """
        seqs = {}
        for i, (size, reply_size) in enumerate(probes):
            self._seq += 1
            seqs[self._seq] = (i, size, reply_size)
        got: dict[int, Reply] = {}
        self._send(seqs, got, mode)
        start = time.monotonic()
        resent = resend_s is None
        while len(got) < len(seqs) and (left := start + wait_s - time.monotonic()) > 0:
            if not resent:
                left = min(left, start + resend_s - time.monotonic())
                if left <= 0:
                    self._send(seqs, got, mode)
                    resent = True
                    continue
            if not select.select([self._sock], [], [], left)[0]:
                continue
            try:
                data, anc, _flags, _src = self._sock.recvmsg(wire.MAX_DATAGRAM, 256)
            except OSError as exc:
                raise _fail(exc, f"udp from {self.dst}:{self.port}") from None
            fields = wire.parse_datagram(data)
            info = wire.pktinfo(anc)
            if fields and fields.get("seq") in seqs:
                i = seqs[fields["seq"]][0]
                got[i] = Reply(fields, info[0] if info else 0, len(data) + wire.IP_UDP_HEADERS)
        return got

    def _send(self, seqs: dict, got: dict, mode: str) -> None:
        for seq, (i, size, reply_size) in seqs.items():
            if i in got:
                continue
            try:
                self._sock.send(wire.datagram({"seq": seq, "mode": mode, "reply_size": reply_size}, size))
            except OSError as exc:
                if exc.errno != errno.EMSGSIZE:  # EMSGSIZE: above our MTU or a learnt path MTU: lost
                    raise _fail(exc, f"udp to {self.dst}:{self.port}") from None

    def path(self, mode: str, wait_s: float) -> Reply:
        got = self.exchange([(self.SMALL, 0)], mode, wait_s, resend_s=wait_s / 3)
        if not got:
            raise ProbeError("timeout", f"udp to {self.dst}:{self.port}: no answer in {wait_s:g} s")
        return got[0]

    def passes_out(self, sizes: list[int], wait_s: float, resend_s: float | None = None) -> set[int]:
        """The sizes whose don't-fragment datagrams reached the peer."""
        got = self.exchange([(s, 0) for s in sizes], "device", wait_s, resend_s)
        return {sizes[i] for i in got}

    def passes_back(self, sizes: list[int], wait_s: float, resend_s: float | None = None) -> set[int]:
        """The sizes whose don't-fragment datagrams from the peer reached us."""
        got = self.exchange([(self.SMALL, s) for s in sizes], "device", wait_s, resend_s)
        return {sizes[i] for i, r in got.items() if r.size >= sizes[i] and "send_error" not in r.fields}


def largest_passing(passes: Callable[[list[int]], set[int]], low: int, high: int,
                    per_round: int = 8, rounds: int = 8) -> int:
    """The largest size in [low, high) that passes, given that low passes and high does not:
    each round tries per_round sizes at once (one wait per round, not per size)."""
    for _ in range(rounds):
        if high - low <= 1:
            break
        step = max(1, (high - low) // (per_round + 1))
        sizes = list(range(low + step, high, step))[:per_round]
        passed = passes(sizes)
        low = max([s for s in sizes if s in passed], default=low)
        high = min([s for s in sizes if s > low and s not in passed], default=high)
    return low
