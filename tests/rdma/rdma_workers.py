"""Rank functions for the RDMA rails, run inside the emulated guest (spawned: top-level).

Rank 0 is end A of every rail, rank 1 end B; the guest publishes the map in R2CC_GUEST_*
(r2cc_testbed/guest/topology.py). A fault is a real kernel event there: `ip link set NETDEV
down` on the netdev under a rail's RDMA device (its port goes DOWN, its queue pairs fail).
"""

from __future__ import annotations

import datetime
import fcntl
import os
import pathlib
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import torch

from tests.comm.harness import close_after_barrier, store_barrier
from tests.comm.lab_workers import _fault_while_in_flight, _totals, _warmed_up_inputs
from tests.comm.workers import all_collectives, bits_equal, make_input, open_comm, reference_reduce

END = "AB"


def guest_rails(rank: int) -> list[str]:
    return os.environ[f"R2CC_GUEST_RAILS_{END[rank]}"].split(",")


def guest_netdev(rank: int, rail: int) -> str:
    return os.environ[f"R2CC_GUEST_NETDEVS_{END[rank]}"].split(",")[rail]


def guest_ip(rank: int, rail: int) -> str:
    return os.environ[f"R2CC_GUEST_IPS_{END[rank]}"].split(",")[rail]


def set_link(netdev: str, up: bool) -> None:
    """`ip link set NETDEV up|down`, done in this process by ioctl: under emulation starting an
    `ip` process from a rank (torch loaded) takes a second or more, which would count as detection."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sh22x", netdev.encode(), 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
        flags = (flags | IFF_UP) if up else (flags & ~IFF_UP)
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sh22x", netdev.encode(), flags))


SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def _wait_states(comm, want: str, timeout_s: float) -> float:
    """Seconds until every rail is in state `want` (or the timeout, returned as -1)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if all(s == want for s in _totals(comm)["states"].values()):
            return time.monotonic() - t0
        time.sleep(0.02)
    return -1.0


def collectives_exact(rank, world, store, sizes, rails=None):
    """Every collective, dtype and size over the rails given (default: the guest's RDMA rails)."""
    opts = {"rails": rails[rank] if rails else guest_rails(rank)}
    return all_collectives(rank, world, store, sizes, opts)


def mixed_rails(rank, world, store, sizes):
    """Rail 0 on RDMA, rail 1 on TCP (the address of rail 1's netdev): both carry bytes."""
    rails = [guest_rails(rank)[0], guest_ip(rank, 1)]
    comm = open_comm(rank, world, store, rails=rails)
    try:
        n = 1 << 20
        inputs = [make_input(r, n, torch.float32) for r in range(world)]
        exact = all(bits_equal(comm.all_reduce(inputs[rank].clone()), reference_reduce(inputs, "sum"))
                    for _ in range(3))
        return {"exact": exact, "kinds": list(comm.rail_kinds), "sent_by_rail": _totals(comm)["sent_by_rail"]}
    finally:
        close_after_barrier(comm, store, "end", rank, world)


def link_down_mid_collective(rank, world, store, n):
    """Rank 0 takes its netdev of rail 1 down while an all_reduce of n floats has bytes in flight on
    it: the result is exact, the rail failed over; then the link comes back and the rail is
    re-admitted and carries bytes again."""
    rail = 1  # the rail _fault_while_in_flight watches
    comm = open_comm(rank, world, store, rails=guest_rails(rank))
    try:
        inputs, want = _warmed_up_inputs(comm, rank, world, n)
        store_barrier(store, "go", rank, world)
        fault = {}
        done = threading.Event()

        def take_down():
            fault["at"] = time.monotonic()
            set_link(guest_netdev(0, rail), False)

        # as soon as the rail holds chunks the peer has not acknowledged (the lab's fault tests' way)
        downer = threading.Thread(target=_fault_while_in_flight, args=(comm, take_down, 0.0, done, fault)) \
            if rank == 0 else None
        if downer:
            downer.start()
        t0 = time.monotonic()
        got = comm.all_reduce(inputs[rank].clone())
        took = time.monotonic() - t0
        done.set()
        if downer:
            downer.join()
        # Detection: how long after the link went down the rail left service on this rank.
        detected_s = -1.0
        if rank == 0 and "at" in fault:
            while time.monotonic() - fault["at"] < 10:
                if _totals(comm)["states"][rail] != "up":
                    detected_s = time.monotonic() - fault["at"]
                    break
                time.sleep(0.005)
        during = _totals(comm)
        rail_error = [s["last_error"] for s in comm.rail_stats() if s["rail"] == rail]
        silence = [s["last_detect_s"] for s in comm.rail_stats() if s["rail"] == rail]
        store_barrier(store, "measured", rank, world)
        if rank == 0:
            set_link(guest_netdev(0, rail), True)
        readmit_s = _wait_states(comm, "up", 30)
        store_barrier(store, "readmitted", rank, world)
        before = _totals(comm)["sent_by_rail"][rail]
        after = [comm.all_reduce(inputs[rank].clone()) for _ in range(3)]
        return {"exact": bits_equal(got, want), "exact_after": all(bits_equal(a, want) for a in after),
                "in_flight_at_fault": fault.get("inflight_at_fault", False), "took_s": took, "detected_s": detected_s,
                "failovers": during["failovers"], "resent_bytes": during["resent_bytes"],
                "readmit_s": readmit_s, "rail_bytes_after": _totals(comm)["sent_by_rail"][rail] - before,
                "rail_error": rail_error, "silence_before_detect_s": silence}
    finally:
        close_after_barrier(comm, store, "end", rank, world)


def peer_killed(rank, world, store):
    """Rank 1's process is SIGKILLed while rank 0 waits in an all_reduce: rank 0 raises an error
    that says the peer is gone (the kernel closed the rail's set-up socket), never waits on."""
    if rank == 1:
        root = pathlib.Path(__file__).resolve().parents[2]
        proc = subprocess.run([sys.executable, "-m", "tests.rdma.rdma_workers", str(rank), str(world), store.host,
                               str(store.port)], cwd=root, timeout=300, capture_output=True, text=True)
        return {"victim": True, "exitcode": proc.returncode, "stderr": proc.stderr[-2000:]}
    return _survivor(rank, world, store)


def _survivor(rank, world, store):
    from r2cc_serve.errors import R2CCError

    comm = open_comm(rank, world, store, rails=guest_rails(rank), group="gone")
    try:
        x = torch.ones(1 << 10)
        comm.all_reduce(x.clone())
        store.set("survivor_waiting", "1")
        t0 = time.monotonic()
        try:
            comm.all_reduce(x.clone())  # the victim is killed instead of joining
            return {"raised": None}
        except R2CCError as exc:
            return {"raised": type(exc).__name__, "kind": exc.kind, "msg": str(exc),
                    "after_s": time.monotonic() - t0, "rail_errors": [s["last_error"] for s in comm.rail_stats()]}
    finally:
        comm.close()


def _doomed_rank(rank, world, host, port):
    from torch.distributed import TCPStore

    store = TCPStore(host, port, world, False, timeout=datetime.timedelta(seconds=120))
    comm = open_comm(rank, world, store, rails=guest_rails(rank), group="gone")
    comm.all_reduce(torch.ones(1 << 10))
    store.get("survivor_waiting")
    time.sleep(0.2)  # the survivor is inside its next all_reduce by now
    os.kill(os.getpid(), signal.SIGKILL)  # no goodbye, no completion: the adapter just stops answering


def peer_host_cut_off(rank, world, store, deadline_s):
    """Every netdev of rank 1's rails goes down mid-stream: no completion says so, only r2cc's
    watchdog (with the ports' state) can. Rank 1 aborts the group (rails down) within deadline_s,
    and so does rank 0 (which error it sees first depends on whether rank 1's goodbye reaches it:
    in the guest it can, over the host's own loopback)."""
    from r2cc_serve.errors import R2CCError

    comm = open_comm(rank, world, store, rails=guest_rails(rank), group="cut")
    try:
        x = torch.ones(1 << 16)
        comm.all_reduce(x.clone())
        store_barrier(store, "go", rank, world)
        if rank == 1:
            for k in range(comm.num_rails):
                set_link(guest_netdev(1, k), False)
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < deadline_s + 30:
                comm.all_reduce(x.clone())
            return {"raised": None}
        except R2CCError as exc:
            return {"raised": type(exc).__name__, "kind": exc.kind, "msg": str(exc).splitlines()[0],
                    "after_s": time.monotonic() - t0}
    finally:
        if rank == 1:
            for k in range(comm.num_rails):
                set_link(guest_netdev(1, k), True)
        comm.close()


if __name__ == "__main__":
    _doomed_rank(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))


def flapping_link_is_held(rank, world, store, flaps, hold_s):
    """Rank 0 takes rail 1's netdev down and up `flaps` times while all_reduces run: the flap
    dampening holds the rail out as it does a TCP rail (every result exact), and the rail is back
    in service carrying bytes once the hold ends."""
    from tests.comm.lab_workers import _reduce_until

    comm = open_comm(rank, world, store, rails=guest_rails(rank), hold_s=hold_s)
    rail = 1

    def rail1():
        return next(s for s in comm.rail_stats() if s["rail"] == rail)

    try:
        inputs, want = _warmed_up_inputs(comm, rank, world, 1 << 18)
        store_barrier(store, "go", rank, world)
        seen = {"held": False}
        flapper_done = threading.Event()

        def flap():
            try:
                for _ in range(flaps):
                    set_link(guest_netdev(0, rail), False)
                    time.sleep(0.5)
                    set_link(guest_netdev(0, rail), True)
                    t0 = time.monotonic()  # back up (or held) before the next flap
                    while time.monotonic() - t0 < 5 and rail1()["state"] not in ("up", "held"):
                        time.sleep(0.02)
                    if rail1()["state"] == "held" and not seen["held"]:
                        seen.update(held=True, hold_reason=rail1()["hold_reason"])
            finally:
                flapper_done.set()

        flapper = threading.Thread(target=flap) if rank == 0 else None
        if flapper:
            flapper.start()
        exact, calls, _ = _reduce_until(comm, world, inputs[rank], want,
                                        lambda c, s: flapper_done.is_set() if rank == 0 else True)
        if flapper:
            flapper.join()
        s = rail1()
        out = {"exact": exact, "calls": calls, "seen_held": seen["held"] or s["state"] == "held",
               "holds": s["holds"], "flap_failures": s["flap_failures"],
               "hold_reason": seen.get("hold_reason") or s["hold_reason"]}
        t0 = time.monotonic()
        while time.monotonic() - t0 < hold_s * 4 + 10 and rail1()["state"] != "up":
            time.sleep(0.05)
        out["up_after_s"] = time.monotonic() - t0 if rail1()["state"] == "up" else -1.0
        store_barrier(store, "back", rank, world)
        before = rail1()["bytes_sent"]
        for _ in range(5):
            out["exact"] &= bits_equal(comm.all_reduce(inputs[rank].clone()), want)
        out["bytes_after"] = rail1()["bytes_sent"] - before
        return out
    finally:
        close_after_barrier(comm, store, "end", rank, world)
