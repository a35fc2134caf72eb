"""What the checker and the responder say to each other, and the socket options both use.

One port number, both protocols: UDP for path and MTU probes (datagrams of a chosen size, with
don't-fragment), TCP for the control exchange ("hello": the responder's interfaces and kernel
settings) and the bandwidth probe, which runs on an ephemeral port the responder opens on
request, as r2cc's transport listens on one (csrc/net.cc listen_on).

A UDP datagram is MAGIC, a JSON object, a newline and zero padding up to the size asked for.
A TCP message is one JSON object on one line.
"""

from __future__ import annotations

import json
import socket
import struct
import time

DEFAULT_PORT = 29640
MAGIC = b"r2cc-doctor 1\n"
MAX_DATAGRAM = 65535           # the largest IPv4 packet; UDP payload = size - 28
IP_UDP_HEADERS = 28
MAX_LINE = 1 << 20

# <linux/in.h>; Python's socket module does not name them all.
IP_PKTINFO = getattr(socket, "IP_PKTINFO", 8)
IP_MTU_DISCOVER = getattr(socket, "IP_MTU_DISCOVER", 10)
IP_PMTUDISC_DO = getattr(socket, "IP_PMTUDISC_DO", 2)
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
_PKTINFO = struct.Struct("=i4s4s")  # struct in_pktinfo: ifindex, spec_dst, addr


def datagram(fields: dict, size: int) -> bytes:
    """A datagram that makes an IPv4 packet of `size` bytes (at least its header and fields)."""
    head = MAGIC + json.dumps(fields, separators=(",", ":")).encode() + b"\n"
    return head + bytes(max(0, size - IP_UDP_HEADERS - len(head)))


def parse_datagram(data: bytes) -> dict | None:
    if not data.startswith(MAGIC):
        return None
    end = data.find(b"\n", len(MAGIC))
    try:
        fields = json.loads(data[len(MAGIC):end])
    except ValueError:
        return None
    return fields if end > 0 and isinstance(fields, dict) else None


def pktinfo(ancdata) -> tuple[int, str] | None:
    """(arrival ifindex, destination address) from recvmsg's ancillary data."""
    for level, kind, data in ancdata:
        if level == socket.IPPROTO_IP and kind == IP_PKTINFO and len(data) >= _PKTINFO.size:
            ifindex, _spec_dst, addr = _PKTINFO.unpack(data[:_PKTINFO.size])
            return ifindex, socket.inet_ntoa(addr)
    return None


def pktinfo_out(ifindex: int, src: str) -> list:
    """Ancillary data for sendmsg: source address src, and out of ifindex unless it is 0."""
    return [(socket.IPPROTO_IP, IP_PKTINFO, _PKTINFO.pack(ifindex, socket.inet_aton(src), bytes(4)))]


def udp_socket(device: str | None = None) -> socket.socket:
    """A UDP socket (bound to `device` if given; not yet to an address) that reports each
    datagram's arrival interface and sends with don't-fragment."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        if device:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, device.encode())
        sock.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
        sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
        big_receive_buffer(sock)
        return sock
    except BaseException:
        sock.close()
        raise


def big_receive_buffer(sock: socket.socket) -> None:
    # An MTU search sends a few full-size datagrams at once; the default buffer (~208 KiB)
    # would drop jumbo ones and make them look lost on the wire.
    for opt in (SO_RCVBUFFORCE, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
            return
        except OSError:
            continue


def send_line(sock: socket.socket, fields: dict) -> None:
    sock.sendall(json.dumps(fields, separators=(",", ":")).encode() + b"\n")


def recv_line(sock: socket.socket, timeout_s: float) -> dict:
    """One JSON line; TimeoutError if it does not come within timeout_s, ConnectionError if the
    other end closes or sends something else."""
    deadline = time.monotonic() + timeout_s
    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no answer")
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            raise TimeoutError("no answer") from None
        if not chunk:
            raise ConnectionError("closed by the other end")
        buf += chunk
        if len(buf) > MAX_LINE:
            raise ConnectionError("line too long: not an r2cc doctor")
    line = buf.split(b"\n", 1)[0]
    try:
        fields = json.loads(line)
    except ValueError:
        raise ConnectionError("not an r2cc doctor answer") from None
    if not isinstance(fields, dict):
        raise ConnectionError("not an r2cc doctor answer")
    return fields


# --- the bandwidth probe's stream ------------------------------------------------------------

CHUNK = 256 * 1024


def stream_for(sock: socket.socket, seconds: float, timeout_s: float) -> None:
    """Send zeros for `seconds`, then close our side: the end of the stream tells the receiver."""
    payload = bytes(CHUNK)
    sock.settimeout(timeout_s)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sock.sendall(payload)
    sock.shutdown(socket.SHUT_WR)


def count_stream(sock: socket.socket, limit_s: float) -> dict:
    """Count bytes until the sender closes (or limit_s passes); the time runs from the first
    byte to the last, so neither connecting nor the closing handshake counts."""
    got, first, last = 0, None, None
    deadline = time.monotonic() + limit_s
    sock.settimeout(1.0)
    while time.monotonic() < deadline:
        try:
            n = len(sock.recv(CHUNK))
        except socket.timeout:
            continue
        if not n:
            break
        last = time.monotonic()
        first = first or last
        got += n
    return {"bytes": got, "seconds": (last - first) if first and last else 0.0}
