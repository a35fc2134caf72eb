"""The in-process fault executor: lab faults made with no command started per change.

The lab's executor starts `ip`/`nft` for each change; under serving load a process start at
nice 0 waits seconds for a CPU. Here everything is opened once, before a round (the load test's
fault daemon holds one InProcessExecutor):
  - one socket per namespace (created inside it, lab/ping.py): SIOCSIFFLAGS on that socket sets
    a link down or up in that namespace, SIOCGIFFLAGS reads whether the kernel sees a carrier;
  - libnftables through ctypes, called with this thread inside the host's namespace (setns),
    for the nftables faults (the same tables as the lab's, so `r2cc lab fault ... clear` and
    the lab's own clear remove them too).
  - one `tc -batch -` process per namespace, started before the round, for rate changes
    (degrade, and clear after one): a command written to it is done in well under a millisecond,
    where a `tc` process started per change took 10-110 ms under load (4 rails: 180 ms).
What a kind does is FaultExecutor.apply's (executor.py); this is how it is done in-process.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import os
import select
import socket
import struct
import subprocess
import threading
import time
from typing import Iterator

from r2cc_testbed.faults.executor import Check, FaultExecutor
from r2cc_testbed.lab.layout import Layout
from r2cc_testbed.lab.shaping import shape_args
from r2cc_testbed.lab.netns import NETNS_DIR, LabError
from r2cc_testbed.lab.ping import socket_in_netns

_SIOCGIFFLAGS, _SIOCSIFFLAGS = 0x8913, 0x8914
_IFF_UP, _IFF_RUNNING = 0x1, 0x40  # RUNNING: the kernel sees a carrier (both veth ends up)
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class LinkSwitch:
    """Link up/down and carrier reads on lab interfaces, through one socket per namespace."""

    def __init__(self, namespaces: list[str]):
        self._socks = {ns: socket_in_netns(ns, socket.AF_INET, socket.SOCK_DGRAM) for ns in namespaces}

    def flags(self, ns: str, dev: str) -> int:
        req = struct.pack("16sH22x", dev.encode(), 0)
        return struct.unpack("16sH22x", fcntl.ioctl(self._socks[ns].fileno(), _SIOCGIFFLAGS, req))[1]

    def set_up(self, ns: str, dev: str, up: bool) -> None:
        flags = self.flags(ns, dev)
        flags = flags | _IFF_UP if up else flags & ~_IFF_UP
        fcntl.ioctl(self._socks[ns].fileno(), _SIOCSIFFLAGS, struct.pack("16sH22x", dev.encode(), flags))

    def carrier(self, ns: str, dev: str) -> bool:
        return bool(self.flags(ns, dev) & _IFF_RUNNING)

    def wait_carrier(self, ns: str, dev: str, present: bool, timeout_s: float = 0.2) -> float | None:
        """time.monotonic() when the carrier of dev was first seen present/absent (None: not in time)."""
        deadline = time.monotonic() + timeout_s
        while True:
            now = time.monotonic()
            if self.carrier(ns, dev) == present:
                return now
            if now > deadline:
                return None
            time.sleep(0.0002)

    def close(self) -> None:
        for s in self._socks.values():
            s.close()


class NftInNamespaces:
    """libnftables in-process; each call runs with the calling thread inside the target namespace."""

    def __init__(self, namespaces: list[str]):
        path = ctypes.util.find_library("nftables") or "libnftables.so.1"
        try:
            self._lib = ctypes.CDLL(path)
        except OSError as exc:
            raise LabError(f"cannot load libnftables ({exc}): apt-get install -y nftables") from None
        self._lib.nft_ctx_new.restype = ctypes.c_void_p
        self._lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        self._lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        self._lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
        self._lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
        self._lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
        self._home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        self._fds = {ns: os.open(os.path.join(NETNS_DIR, ns), os.O_RDONLY) for ns in namespaces}
        self._ctx = {}
        self._lock = threading.Lock()
        for ns in namespaces:  # made inside the namespace: its netlink socket belongs there
            with self._inside(ns):
                self._ctx[ns] = self._lib.nft_ctx_new(0)
                self._lib.nft_ctx_buffer_error(self._ctx[ns])

    def run(self, ns: str, script: str) -> None:
        # One call at a time: an nft context is not thread-safe (two threads in it crashed the process).
        with self._lock, self._inside(ns):
            rc = self._lib.nft_run_cmd_from_buffer(self._ctx[ns], script.encode())
            err = "" if rc == 0 else (self._lib.nft_ctx_get_error_buffer(self._ctx[ns]) or b"").decode(
                errors="replace").strip()
        if rc != 0:
            raise LabError(f"nft in {ns} failed: {err or 'no message'}")

    @contextlib.contextmanager
    def _inside(self, ns: str) -> Iterator[None]:
        enter_netns(self._fds[ns], ns)
        try:
            yield
        finally:
            enter_netns(self._home, "the original namespace")

    def close(self) -> None:
        for fd in [self._home, *self._fds.values()]:
            os.close(fd)


class LineReader:
    """Lines from a file descriptor, with a timeout (select), never blocking past it."""

    def __init__(self, fd: int):
        self.fd, self.buf, self.eof = fd, b"", False

    def next(self, timeout_s: float | None) -> str | None:
        """The next line; None at end of file or when timeout_s passes first (eof tells which)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while b"\n" not in self.buf and not self.eof:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 65536)
            self.buf += chunk
            self.eof = not chunk
        if b"\n" not in self.buf:
            return None
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()


class TcSessions:
    """One long-lived `tc -force -batch -` per namespace; run() returns once tc has done the commands.

    tc reads its batch line by line and runs each at once. After the commands comes a `show` of a
    device that does not exist: its error line marks the end of their output (errors included)."""

    _MARK_DEV = "r2ccmark0"  # no such device anywhere (IFNAMSIZ: at most 15 characters)

    def __init__(self, namespaces: list[str]):
        self._procs, self._out = {}, {}
        for ns in namespaces:
            proc = subprocess.Popen(["ip", "netns", "exec", ns, "tc", "-force", "-batch", "-"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0)
            self._procs[ns], self._out[ns] = proc, LineReader(proc.stdout.fileno())
        for ns in namespaces:
            self.run(ns, [])  # started and answering before the first fault is due

    def run(self, ns: str, commands: list[str], timeout_s: float = 5.0) -> list[str]:
        """Run tc commands in ns; returns the lines tc printed for them (errors say "Command failed")."""
        script = "".join(f"{c}\n" for c in commands) + f"qdisc show dev {self._MARK_DEV}\n"
        self._procs[ns].stdin.write(script.encode())
        out: list[str] = []
        deadline = time.monotonic() + timeout_s
        while True:
            line = self._next_line(ns, deadline)
            if self._MARK_DEV in line:
                self._next_line(ns, deadline)  # its "Command failed -:N"
                return out
            out.append(line)

    def _next_line(self, ns: str, deadline: float) -> str:
        reader = self._out[ns]
        line = reader.next(max(0.0, deadline - time.monotonic()))
        if line is None and reader.eof:
            raise LabError(f"the tc batch process of {ns} exited (code {self._procs[ns].poll()})")
        if line is None:
            raise LabError(f"tc in {ns} did not answer in time; its commands may be half done")
        return line

    def set_rate(self, layout: Layout, host: int, rail: int, rate: str | None) -> None:
        """Both directions of host's rail to rate (None: unshaped), as lab/shaping.py does."""
        for ns, dev in layout.link_ends(host, rail):
            if rate is None:  # deleting a root that is not there only prints an error: harmless
                self.run(ns, [f"qdisc del dev {dev} root"])
                continue
            out = self.run(ns, [" ".join(shape_args(dev, rate))])
            if any("Command failed" in line for line in out):
                raise LabError(f"tc in {ns} could not shape {dev} to {rate}: {' | '.join(out)}")

    def close(self) -> None:
        for proc in self._procs.values():
            with contextlib.suppress(OSError):
                proc.stdin.close()
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()


def enter_netns(fd: int, what: str) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        raise LabError(f"setns into {what} failed: {os.strerror(ctypes.get_errno())} (needs root)")


class InProcessExecutor(FaultExecutor):
    """Lab faults through open namespace sockets, libnftables and tc batch processes.

    set_link returns a check on the link state (operstate) the kernel shows. Rates: only a rail
    this executor degraded gets the lab's rate back on clear (a tc change costs even here)."""

    def __init__(self, layout: Layout, lab_rate: str | None, mtu: int | None):
        super().__init__(layout, lab_rate, mtu)
        hosts = [layout.host_ns(i) for i in range(layout.hosts)]
        namespaces = hosts + ([layout.switch_ns] if layout.switched else [])
        self.links = LinkSwitch(namespaces)
        self.nft = NftInNamespaces(namespaces)  # a lossy or gray rail's far end may be the switch
        self.tc = TcSessions(namespaces)
        self.degraded: set[tuple[int, int]] = set()

    def set_link(self, host: int, rail: int, up: bool) -> Check:
        """Down: the check is that the peer's end has lost its carrier. Up: that our end has a
        carrier again. The kernel updates that state from a worker thread (linkwatch), so it may
        lag the change itself."""
        (ns, dev), (peer_ns, peer_dev) = self.layout.link_ends(host, rail)
        self.links.set_up(ns, dev, up)
        if up:
            return lambda: self.links.carrier(ns, dev)
        return lambda: not self.links.carrier(peer_ns, peer_dev)

    def run_nft(self, ns: str, script: str) -> None:
        self.nft.run(ns, script)

    def set_rate(self, host: int, rail: int, rate: str | None) -> None:
        self.tc.set_rate(self.layout, host, rail, rate)
        self.degraded.add((host, rail))

    def restore_rate(self, host: int, rail: int) -> None:
        if (host, rail) in self.degraded:
            self.tc.set_rate(self.layout, host, rail, self.lab_rate)
            self.degraded.discard((host, rail))
