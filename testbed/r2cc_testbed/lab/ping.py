"""Reachability checks from inside a lab host without external tools (no `ping` needed).

A socket belongs to the network namespace it was created in, so we switch only a helper
thread into the host's namespace (setns), create the socket there, and switch back; the
socket keeps working from any thread. See docs/design.md, "Facts the code relies on".
"""

from __future__ import annotations

import ctypes
import os
import select
import socket
import struct
import threading
import time

from r2cc_testbed.lab.netns import NETNS_DIR, LabError

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def socket_in_netns(ns: str | None, family: int, type_: int, proto: int = 0) -> socket.socket:
    """A socket created inside network namespace ns (None: the caller's own namespace).

    The caller's namespace is untouched: only a short-lived helper thread enters ns.
    """
    if ns is None:
        return socket.socket(family, type_, proto)
    result: dict = {}

    def make() -> None:
        try:
            result["sock"] = _make_in_netns(ns, family, type_, proto)
        except BaseException as exc:  # handed to the caller below
            result["error"] = exc

    worker = threading.Thread(target=make, name=f"r2cc-lab-setns-{ns}")
    worker.start()
    worker.join()
    if "error" in result:
        raise result["error"]
    return result["sock"]


def _make_in_netns(ns: str, family: int, type_: int, proto: int) -> socket.socket:
    with open("/proc/thread-self/ns/net") as home, open(os.path.join(NETNS_DIR, ns)) as target:
        _setns(target.fileno(), ns)
        try:
            return socket.socket(family, type_, proto)
        finally:
            _setns(home.fileno(), "the original namespace")


def _setns(fd: int, what: str) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise LabError(f"setns into {what} failed: {os.strerror(err)} (needs root)")


def ping(ns: str | None, dst_ip: str, timeout_s: float = 1.0) -> bool:
    """One ICMP echo from namespace ns (None: our own) to dst_ip; True if answered in time."""
    sock = socket_in_netns(ns, socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    with sock:
        ident, seq = os.getpid() & 0xFFFF, int(time.monotonic() * 1000) & 0xFFFF
        try:
            sock.sendto(_echo_request(ident, seq), (dst_ip, 0))
        except OSError:  # e.g. ENETUNREACH when our own rail is down
            return False
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([sock], [], [], left)[0]:
                return False
            packet, (src, _) = sock.recvfrom(65535)
            if src == dst_ip and _is_echo_reply(packet, ident, seq):
                return True
        return False


def _echo_request(ident: int, seq: int) -> bytes:
    payload = b"r2cc-lab-probe"
    header = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
    checksum = _checksum(header + payload)
    return struct.pack("!BBHHH", 8, 0, checksum, ident, seq) + payload


def _is_echo_reply(packet: bytes, ident: int, seq: int) -> bool:
    ihl = (packet[0] & 0x0F) * 4  # raw IPv4 sockets hand us the IP header too
    if len(packet) < ihl + 8:
        return False
    kind, _code, _sum, got_ident, got_seq = struct.unpack("!BBHHH", packet[ihl:ihl + 8])
    return kind == 0 and got_ident == ident and got_seq == seq


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF
