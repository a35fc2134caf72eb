"""Rank functions for the multi-process tests (spawned: must be importable top-level)."""

from __future__ import annotations

import json
import os
import threading
import time

import torch
from tests.comm.harness import store_barrier

LOOPBACK_RAILS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64]


def make_input(rank: int, n: int, dtype, salt: int = 0) -> torch.Tensor:
    """Deterministic per-rank data that every rank can recompute for references."""
    g = torch.Generator().manual_seed(1000 * rank + 7 * n + salt)
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g) * 10).to(dtype)
    return torch.randint(-1000, 1000, (n,), generator=g, dtype=dtype)


def reference_reduce(tensors: list[torch.Tensor], op: str) -> torch.Tensor:
    """Element-wise reduction in rank order; 16-bit floats accumulate in fp32 and round once."""
    wide = tensors[0].dtype in (torch.float16, torch.bfloat16)
    acc = tensors[0].float() if wide else tensors[0].clone()
    for t in tensors[1:]:
        t = t.float() if wide else t
        acc = acc + t if op == "sum" else (torch.maximum(acc, t) if op == "max" else torch.minimum(acc, t))
    return acc.to(tensors[0].dtype)


def open_comm(rank, world, store, rails=None, netns=None, group="test", **opts):
    from r2cc_serve import Communicator

    return Communicator(rank, world, store, rails or LOOPBACK_RAILS, netns=netns, group=group, **opts)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(-1).view(torch.uint8) if a.numel() else a,
                                                                     b.view(-1).view(torch.uint8) if b.numel() else b)


def all_collectives(rank, world, store, sizes, opts):
    """Runs every collective for every dtype/size; returns a list of failures (empty = good)."""
    comm = open_comm(rank, world, store, **opts)
    bad = []
    try:
        for dtype in DTYPES:
            for n in sizes:
                inputs = [make_input(r, n, dtype) for r in range(world)]
                for op in ("sum", "max", "min"):
                    got = comm.all_reduce(inputs[rank].clone(), op=op)
                    if not bits_equal(got, reference_reduce(inputs, op)):
                        bad.append(f"all_reduce {op} {dtype} n={n}")
                out = comm.all_reduce(inputs[rank], inplace=False)
                if not bits_equal(out, reference_reduce(inputs, "sum")) or not bits_equal(inputs[rank], make_input(rank, n, dtype)):
                    bad.append(f"all_reduce out-of-place {dtype} n={n}")
                g = comm.all_gather(inputs[rank])
                if not bits_equal(g.view(-1), torch.cat(inputs)):
                    bad.append(f"all_gather {dtype} n={n}")
                big = [make_input(r, n * world, dtype, salt=1) for r in range(world)]
                rs = comm.reduce_scatter(big[rank])
                want = reference_reduce(big, "sum")[rank * n:(rank + 1) * n]
                if not bits_equal(rs, want):
                    bad.append(f"reduce_scatter {dtype} n={n}")
                root = n % world
                ga = comm.gather(inputs[rank], dst=root)
                if rank == root and not bits_equal(ga.view(-1), torch.cat(inputs)):
                    bad.append(f"gather {dtype} n={n}")
                b = inputs[rank].clone()
                comm.broadcast(b, src=root)
                if not bits_equal(b, inputs[root]):
                    bad.append(f"broadcast {dtype} n={n}")
        # point to point around a ring
        x = make_input(rank, 4099, torch.float32)
        y = torch.empty_like(x)
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        if rank % 2 == 0:
            comm.send(x, nxt)
            comm.recv(y, prv)
        else:
            comm.recv(y, prv)
            comm.send(x, nxt)
        if not bits_equal(y, make_input(prv, 4099, torch.float32)):
            bad.append("send/recv")
    finally:
        comm.close()
    return bad


def _delayed(seconds, fn, *args):
    t = threading.Timer(seconds, fn, args)
    t.start()
    return t


def failover_mid_collective(rank, world, store, n, delay_s, opts):
    """Rank 0 fails rail 1 over while a large all_reduce runs; result must be bit-exact.

    On loopback a 64 MiB transfer takes milliseconds, so besides the operator failover
    (timer) rank 1's rail 2 is made to fail with a chunk surely in flight."""
    comm = open_comm(rank, world, store, **opts)
    try:
        inputs = [make_input(r, n, torch.float32) for r in range(world)]
        want = reference_reduce(inputs, "sum")
        comm.all_reduce(inputs[rank].clone())  # warm up
        timer = _delayed(delay_s, comm.failover_rail, 1) if rank == 0 else None
        if rank == 1:
            comm.inject_failure(0, 2, after_chunks=5)
        got = comm.all_reduce(inputs[rank].clone())
        if timer:
            timer.join()
        stats_during = comm.rail_stats()
        comm.restore_rail(1)
        deadline = time.time() + 10
        while time.time() < deadline and any(s["state"] != "up" for s in comm.rail_stats()):
            time.sleep(0.05)
        states_after = [s["state"] for s in comm.rail_stats()]
        after = comm.all_reduce(inputs[rank].clone())
        return {
            "exact": bits_equal(got, want),
            "exact_after": bits_equal(after, want),
            "failovers": sum(s["failovers"] for s in stats_during),
            "resent": sum(s["chunks_resent"] for s in stats_during),
            "states_after": states_after,
            "rail1_reconnects": sum(s["reconnects"] for s in comm.rail_stats() if s["rail"] == 1),
        }
    finally:
        comm.close()


def drain_moves_traffic(rank, world, store, opts):
    """While rail 0 is drained (by rank 0 only), no rank sends on it; undrain brings it back."""
    comm = open_comm(rank, world, store, **opts)
    try:
        x = make_input(rank, 1 << 20, torch.float32)

        def sent_on(rail):
            return sum(s["bytes_sent"] for s in comm.rail_stats() if s["rail"] == rail)

        comm.all_reduce(x.clone())
        signatures = [comm.state_signature(), comm.state_signature()]  # traffic alone leaves it
        store.set(f"drain-ready/{rank}", "1")
        if rank == 0:
            comm.drain_rail(0)
        comm.all_reduce(x.clone())  # the drain frame reaches the peers at the latest with this traffic
        store_barrier(store, "drained", rank, world)
        before = sent_on(0)
        states = [s["state"] for s in comm.rail_stats() if s["rail"] == 0]
        signatures.append(comm.state_signature())
        for _ in range(5):
            comm.all_reduce(x.clone())
        during = sent_on(0) - before
        if rank == 0:
            comm.undrain_rail(0)
        comm.all_reduce(x.clone())
        store_barrier(store, "undrained", rank, world)
        before = sent_on(0)
        for _ in range(20):  # on loopback rails race for chunks: give rail 0 many chances
            comm.all_reduce(x.clone())
        return {"during": during, "after": sent_on(0) - before, "states": states, "signatures": signatures,
                "states_after": [(s["state"], s["inflight_bytes"], s["bandwidth_Bps"]) for s in comm.rail_stats()]}
    finally:
        comm.close()


def stranger_rejected(rank, world, store, opts):
    """A process without the secret connects to rank 0's rail ports; the group carries on."""
    import socket

    comm = open_comm(rank, world, store, **opts)
    try:
        x = make_input(rank, 100000, torch.float32)
        want = reference_reduce([make_input(r, 100000, torch.float32) for r in range(world)], "sum")
        if rank == 0:
            addrs = json.loads(store.get("r2cc/test/addr/0").decode())
            for ip, port in addrs:
                with socket.create_connection((ip, port), timeout=2) as s:
                    s.recv(24)  # greeting
                    s.sendall(b"\x43\x43\x32\x52" + b"\x01\x00\x00\x00" + b"x" * 48)  # wrong group, wrong MAC
                    s.settimeout(2)
                    try:
                        s.recv(16)
                    except OSError:
                        pass
            # One that connects and says nothing at all.
            idle = socket.create_connection(tuple(addrs[0]), timeout=2)
        ok = all(bits_equal(comm.all_reduce(x.clone()), want) for _ in range(5))
        if rank == 0:
            time.sleep(1.2)  # past the handshake timeout
            idle.close()
        return {"ok": ok, "rejected": comm.counters()["rejected_handshakes"],
                "failovers": comm.counters()["failovers"]}
    finally:
        comm.close()


def all_rails_down(rank, world, store, opts):
    """Rank 0 fails every rail over; every rank must raise RailsDownError, fast, same text."""
    from r2cc_serve.errors import RailsDownError

    comm = open_comm(rank, world, store, **opts)
    try:
        x = make_input(rank, 1 << 16, torch.float32)
        comm.all_reduce(x.clone())
        store_barrier(store, "ready", rank, world)
        t0 = time.time()
        if rank == 0:
            for rail in range(comm.num_rails):
                comm.failover_rail(rail)
        try:
            for _ in range(1000):
                comm.all_reduce(x.clone())
                time.sleep(0.01)
            return {"raised": None}
        except RailsDownError as exc:
            return {"raised": "RailsDownError", "msg": str(exc), "after_s": time.time() - t0}
        except Exception as exc:  # the wrong kind of error fails the test
            return {"raised": type(exc).__name__, "msg": str(exc), "after_s": time.time() - t0}
    finally:
        comm.close()


def size_mismatch(rank, world, store, opts):
    from r2cc_serve.errors import R2CCError

    comm = open_comm(rank, world, store, **opts)
    try:
        x = torch.ones(1000 + rank * 10)
        try:
            comm.all_gather(x)
            return "no error"
        except R2CCError as exc:
            return str(exc)
    finally:
        comm.close()


def small_messages_through_failover(rank, world, store, opts):
    """Many decode-sized (4 KiB, one-chunk) all_reduces while rank 0 fails rail 1 over midway.

    Returns: were results exact, failovers, chunks re-sent, and chunks sent per message before
    the failover (1.0 when no message needed a hedge copy, 2.0 when every one got one)."""
    comm = open_comm(rank, world, store, rails=LOOPBACK_RAILS[:2], **opts)
    try:
        inputs = [make_input(r, 1024, torch.float32) for r in range(world)]
        want = reference_reduce(inputs, "sum")
        exact = all(bits_equal(comm.all_reduce(inputs[rank].clone()), want) for _ in range(50))  # warm up
        chunks_per_msg = 0.0
        for i in range(3000):
            if i == 1500:  # 1550 one-message all_reduces so far
                chunks_per_msg = sum(s["chunks_sent"] for s in comm.rail_stats()) / 1550
                if rank == 0:
                    comm.failover_rail(1)
            exact = bits_equal(comm.all_reduce(inputs[rank].clone()), want) and exact
        stats = comm.rail_stats()
        return {
            "exact": exact,
            "failovers": sum(s["failovers"] for s in stats),
            "resent": sum(s["chunks_resent"] for s in stats),
            "chunks_per_msg": chunks_per_msg,
        }
    finally:
        comm.close()


def small_messages_to_a_late_peer(rank, world, store, opts, late_s=0.005, count=20):
    """Rank 1 starts each of `count` decode-sized all_reduces `late_s` after rank 0, so rank 0's
    message waits meanwhile. Returns whether results were exact and, per rank, the hedge
    counters over those calls: copies written, those a waiting caller wrote itself, and
    messages left without one because the peer's kernel had acknowledged them."""
    comm = open_comm(rank, world, store, rails=LOOPBACK_RAILS[:2], **opts)
    try:
        inputs = [make_input(r, 1024, torch.float32) for r in range(world)]
        want = reference_reduce(inputs, "sum")
        exact = bits_equal(comm.all_reduce(inputs[rank].clone()), want)
        names = ("hedges", "waiter_hedges", "hedges_unneeded")
        before = comm.counters()
        for _ in range(count):
            if rank == 1:
                time.sleep(late_s)
            exact = bits_equal(comm.all_reduce(inputs[rank].clone()), want) and exact
        after = comm.counters()
        return {"exact": exact, **{n: after[n] - before[n] for n in names}}
    finally:
        comm.close()


def bandwidth_from_large_transfers_only(rank, world, store, opts):
    """Rail bandwidth as measured after many decode-sized all_reduces, then after large ones.

    Small messages spend their busy time on round trips, so they must leave the estimate
    unset (0) rather than make rails look slow at random."""
    comm = open_comm(rank, world, store, **opts)
    try:
        small = [make_input(r, 1024, torch.float32) for r in range(world)]
        exact = True
        for _ in range(3000):
            exact = bits_equal(comm.all_reduce(small[rank].clone()), reference_reduce(small, "sum")) and exact
        time.sleep(0.05)  # one more watchdog pass
        after_small = [s["bandwidth_Bps"] for s in comm.rail_stats()]
        busy_small = sum(s["chunks_sent"] for s in comm.rail_stats())
        chunk_small = comm.peer_stats()[0]["chunk_bytes"]
        large = [make_input(r, 4 << 20, torch.float32) for r in range(world)]
        for _ in range(6):
            exact = bits_equal(comm.all_reduce(large[rank].clone()), reference_reduce(large, "sum")) and exact
        time.sleep(0.05)
        after_large = [s["bandwidth_Bps"] for s in comm.rail_stats()]
        chunk_large = comm.peer_stats()[0]["chunk_bytes"]
        sent = [(s["bytes_sent"], s["chunks_sent"]) for s in comm.rail_stats()]
        exact = bits_equal(comm.all_reduce(large[rank].clone()), reference_reduce(large, "sum")) and exact
        sent = [(s["bytes_sent"] - b, s["chunks_sent"] - c) for s, (b, c) in zip(comm.rail_stats(), sent)]
        return {"exact": exact, "after_small": after_small, "chunks_small": busy_small, "after_large": after_large,
                "chunk_small": chunk_small, "chunk_large": chunk_large,
                "mean_chunk": sum(b for b, _ in sent) / max(1, sum(c for _, c in sent))}
    finally:
        comm.close()


def striping_follows_measured_bandwidth(rank, world, store, opts):
    """Chunks per message of 64 KiB and 256 KiB all_reduces (one message each way: one-shot) and
    the striping choice peer_stats() reports, before any rail is measured and after large
    transfers measured them. Four rails, as the lab's hosts have."""
    comm = open_comm(rank, world, store, rails=LOOPBACK_RAILS + ["127.0.0.4"], **opts)

    def chunks_per_message(size: int, calls: int = 100) -> float:
        x = make_input(rank, size // 4, torch.float32)
        before = sum(s["chunks_sent"] for s in comm.rail_stats())
        for _ in range(calls):
            comm.all_reduce(x.clone())
        return (sum(s["chunks_sent"] for s in comm.rail_stats()) - before) / calls

    def choice() -> dict:
        p = comm.peer_stats()[0]
        return {k: p[k] for k in ("chunk_cost_bytes", "one_rail_max_bytes", "all_rails_min_bytes")}
    try:
        out = {"unmeasured": choice(), "unmeasured_64k": chunks_per_message(64 << 10)}
        large = make_input(rank, 4 << 20, torch.float32)
        for _ in range(6):
            comm.all_reduce(large.clone())
        time.sleep(0.05)  # one more watchdog pass
        out.update(measured=choice(), bandwidth=[s["bandwidth_Bps"] for s in comm.rail_stats()],
                   measured_64k=chunks_per_message(64 << 10), measured_256k=chunks_per_message(256 << 10))
        return out
    finally:
        comm.close()


def spin_pays_or_stops(rank, world, store, opts):
    """Spinning waits (opts spin_us) against a peer that answers at once, then against one that
    is 3 ms late every time: spinning must pay in the first phase and stop in the second."""
    comm = open_comm(rank, world, store, **opts)
    try:
        x = make_input(rank, 1024, torch.float32)
        for _ in range(300):
            comm.all_reduce(x.clone())
        quick = comm.counters()
        for _ in range(200):
            if rank == 1:
                time.sleep(0.003)  # rank 0 waits ~3 ms for every answer
            comm.all_reduce(x.clone())
        late = comm.counters()
        return {"quick_hits": quick["spin_hits"], "quick_misses": quick["spin_misses"],
                "quick_briefs": quick["spin_briefs"],
                "late_hits": late["spin_hits"] - quick["spin_hits"],
                "late_misses": late["spin_misses"] - quick["spin_misses"],
                "late_briefs": late["spin_briefs"] - quick["spin_briefs"]}
    finally:
        comm.close()


def spin_under_cpu_pressure(rank, world, store, opts):
    """500 small all_reduces on this (possibly idle) host, then 500 more while three processes
    busy-loop (rank 0 starts them): spins, skips and the pressure seen in each phase."""
    import subprocess
    import sys

    comm = open_comm(rank, world, store, **opts)
    hogs = []
    try:
        x = make_input(rank, 1024, torch.float32)

        def phase():
            c0 = comm.counters()
            for _ in range(500):
                comm.all_reduce(x.clone())
            c1 = comm.counters()
            spins = (c1["spin_hits"] + c1["spin_misses"]) - (c0["spin_hits"] + c0["spin_misses"])
            briefs = c1["spin_briefs"] - c0["spin_briefs"]
            return {"full_spins": spins - briefs, "briefs": briefs,
                    "spin_skips": c1["spin_skips"] - c0["spin_skips"], "cpu_pressure": c1["cpu_pressure"]}
        idle = phase()
        store_barrier(store, "idle-done", rank, world)
        if rank == 0:  # (a rank is a daemon process: it may start programs, not multiprocessing children)
            hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
        time.sleep(2.5)  # the pressure is smoothed over about a second
        busy = phase()
        store_barrier(store, "busy-done", rank, world)
        return {"idle": idle, "busy": busy}
    finally:
        for h in hogs:
            h.kill()
            h.wait(5)
        comm.close()


def goodbye_is_not_a_warning(rank, world, store, opts):
    """A rail that fails is logged as a warning; the rails of a peer that closed its
    communicator go down too, but that is logged at INFO. Returns the monitor's log records."""
    import logging

    from r2cc_serve.health.monitor import RailMonitor

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append((record.levelname, record.getMessage()))

    logger = logging.getLogger("r2cc_serve.health")
    handler = Keep(level=logging.DEBUG)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    comm = open_comm(rank, world, store, **opts)
    monitor = RailMonitor(comm, "test", rank, rank, None, 0.005, "loopback").start()
    try:
        x = make_input(rank, 4 << 20, torch.float32)
        comm.all_reduce(x.clone())
        if rank == 1:
            comm.inject_failure(0, 2, after_chunks=5)
        comm.all_reduce(x.clone())  # rail 2 fails mid-way; the transfer finishes on the others
        deadline = time.time() + 10
        while time.time() < deadline and any(s["state"] != "up" for s in comm.rail_stats()):
            time.sleep(0.02)
        comm.all_reduce(x.clone())  # both ranks are past the fault
        if rank == 1:
            return records
        store.set("rank0_ready", "1")
        while time.time() < deadline + 10 and not any(p["closed"] for p in comm.peer_stats()):
            time.sleep(0.02)
        time.sleep(0.1)  # a few monitor samples after the goodbye
        return records
    finally:
        monitor.stop()
        if rank == 1:
            store.wait(["rank0_ready"])
        comm.close()
        logger.removeHandler(handler)


def mid_size_chunk_writers(comm, rank, world):
    """20 all_reduces of 256 KiB on rails that had carried only small messages (300 of 4 KiB):
    how many of their chunks a writer thread wrote rather than the posting or waiting caller."""
    small = [make_input(r, 1024, torch.float32) for r in range(world)]
    mid = [make_input(r, 64 << 10, torch.float32) for r in range(world)]
    exact = True
    for _ in range(300):
        exact = bits_equal(comm.all_reduce(small[rank].clone()), reference_reduce(small, "sum")) and exact
    before = comm.counters()["writer_chunks"]
    sent = sum(s["chunks_sent"] for s in comm.rail_stats())
    for _ in range(20):
        exact = bits_equal(comm.all_reduce(mid[rank].clone()), reference_reduce(mid, "sum")) and exact
    return {"exact": exact, "writer_chunks": comm.counters()["writer_chunks"] - before,
            "chunks": sum(s["chunks_sent"] for s in comm.rail_stats()) - sent}


def flapping_rail_is_held(rank, world, store, opts):
    """Rail 2 fails four times (rank 1's fault injector, a chunk in flight each time). The first
    two failures are re-admitted at once; the third holds the rail out at both ends (no bytes on
    it while traffic runs) until the hold ends by itself; the fourth holds it again, twice as long,
    and rank 0's restore_rail ends that hold at both ends. Every result is checked bit for bit."""
    comm = open_comm(rank, world, store, **opts)
    n = 4 << 20  # 16 MiB: many chunks, so the rail's writer thread carries some
    x = make_input(rank, n, torch.float32)
    want = reference_reduce([make_input(r, n, torch.float32) for r in range(world)], "sum")
    exact = True

    def rail2():
        return next(s for s in comm.rail_stats() if s["rail"] == 2)  # two ranks: one peer

    def reduce_exact(times=1):
        nonlocal exact
        for _ in range(times):
            exact &= bits_equal(comm.all_reduce(x.clone()), want)

    def wait_for(states, timeout_s):
        t0 = time.monotonic()
        while rail2()["state"] not in states and time.monotonic() - t0 < timeout_s:
            time.sleep(0.02)
        return rail2()["state"], time.monotonic() - t0

    def fail_rail2(step):
        # A re-dialed rail takes chunks only once its probe is delivered, so one all_reduce may
        # pass it by and leave the injected failure armed for a later phase (a CI failure): the
        # ranks go on until rank 1, whose send fails, has counted it. Both run the same calls.
        store_barrier(store, f"fail{step}", rank, world)
        failures = rail2()["flap_failures"]
        if rank == 1:
            comm.inject_failure(0, 2, after_chunks=2)
        for i in range(100):
            reduce_exact()
            if rank == 1:
                store.set(f"fired{step}/{i}", "1" if rail2()["flap_failures"] > failures else "0")
            if store.get(f"fired{step}/{i}") == b"1":
                return i + 1
        raise AssertionError(f"rail 2's injected failure {step} did not fire in 100 all_reduces")

    # Every change of rail 2's state, with its time, kept so that a failed run says what happened.
    timeline, sampling = [], threading.Event()

    def sample():
        t0, last = time.monotonic(), None
        while not sampling.wait(0.002):
            s = rail2()
            now = (s["state"], s["hold_reason"][:60], s["flap_failures"])
            if now != last:
                timeline.append((round(time.monotonic() - t0, 3), *now))
                last = now

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        reduce_exact()
        out = {"readmitted": [], "timeline": timeline, "calls_to_fail": []}
        for step in range(2):
            out["calls_to_fail"].append(fail_rail2(step))
            out["readmitted"].append(wait_for(("up",), 10))
        out["calls_to_fail"].append(fail_rail2(2))
        out["held"] = wait_for(("held",), 5)
        s = rail2()
        out["hold"] = {k: s[k] for k in ("hold_reason", "hold_left_s", "holds", "flap_failures", "flap_penalty")}
        store_barrier(store, "held", rank, world)
        before = rail2()["bytes_sent"]
        reduce_exact(5)
        out["bytes_while_held"] = rail2()["bytes_sent"] - before
        out["still_held"] = rail2()["state"]
        out["back"] = wait_for(("up",), opts["hold_s"] + 5)
        store_barrier(store, "back", rank, world)
        before = rail2()["bytes_sent"]
        reduce_exact(10)
        out["bytes_after"] = rail2()["bytes_sent"] - before
        out["calls_to_fail"].append(fail_rail2(3))
        out["held_again"] = wait_for(("held",), 5)
        s = rail2()
        out["hold_again"] = {k: s[k] for k in ("hold_reason", "hold_left_s", "holds", "flap_failures", "flap_penalty",
                                               "failovers", "reconnects", "last_error")}
        out["hold_again_left_s"] = s["hold_left_s"]
        store_barrier(store, "restore", rank, world)
        if rank == 0:
            comm.restore_rail(2)
        out["restored"] = wait_for(("up",), 3)
        store_barrier(store, "restored", rank, world)
        out["penalty_after_restore"] = rail2()["flap_penalty"]
        out["holds_counter"] = comm.counters()["holds"]
        reduce_exact()
        out["exact"] = exact
        return out
    finally:
        sampling.set()
        sampler.join(timeout=5)
        comm.close()


def _task_switches(task, wakeups_only: bool = False) -> int:
    """Context switches so far of one thread of this process: voluntary + involuntary, or with
    wakeups_only the voluntary ones alone (the thread went to sleep: one per wake-up). A thread
    preempted while it runs is switched out involuntarily, as often as a busy host decides."""
    kinds = ("voluntary_ctxt_switches:",) if wakeups_only else ("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")
    with open(f"/proc/self/task/{task}/status") as f:
        return sum(int(line.split(":")[1]) for line in f if line.startswith(kinds))


def _thread_switches(wakeups_only: bool = False) -> dict[str, int]:
    """Context switches so far of each r2cc thread of this process, by name (see _task_switches)."""
    out = {}
    for task in os.listdir("/proc/self/task"):
        try:
            name = open(f"/proc/self/task/{task}/comm").read().strip()
            if name.startswith("r2cc-"):
                out[name] = out.get(name, 0) + _task_switches(task, wakeups_only)
        except OSError:  # the thread ended meanwhile
            continue
    return out


def state_waits(rank, world, store, opts, watch_path=""):
    """Rank 0 times wait_state_change against each way it may end: nothing happens (its timeout),
    an interrupt, the watched file touched, and a drain (the signature moves); each cause comes
    from another thread 0.05 s into a 5 s wait. Each entry: (seconds waited, whether the
    signature moved, how many times the waiting thread was switched out meanwhile)."""
    import threading

    comm = open_comm(rank, world, store, **opts)
    try:
        comm.all_reduce(make_input(rank, 1024, torch.float32))
        out = {}
        if rank == 0:
            def timed(cause=None):
                seen, since = comm.state_signature(), time.time_ns()  # both before the cause can come
                if cause:
                    threading.Timer(0.05, cause).start()
                t0, switches = time.monotonic(), _task_switches(threading.get_native_id())
                now = comm.wait_state_change(seen, 0.01, 0.2 if cause is None else 5.0, watch_path, since)
                return time.monotonic() - t0, now != seen, _task_switches(threading.get_native_id()) - switches
            out["quiet"] = timed()
            back = threading.Event()

            def interrupt_until_back():  # again and again: one before the wait began does not count
                while not back.wait(0.05):
                    comm.interrupt_state_wait()
            out["interrupt"] = timed(lambda: threading.Thread(target=interrupt_until_back, daemon=True).start())
            back.set()
            out["touched"] = timed(lambda: os.utime(watch_path))
            out["drain"] = timed(lambda: comm.drain_rail(0))
        store_barrier(store, "waited", rank, world)
        return out
    finally:
        comm.close()


def watchdog_passes_while_spinning_and_idle(rank, world, store, opts, phase_s=0.6, late_s=100e-6):
    """Back-to-back small all_reduces for phase_s, rank 1 late_s late to each (busy, so rank 0's
    caller spins for it every time), then as long idle: the transport's watchdog passes in each
    phase, how many the callers ran, and how often the watchdog thread itself woke."""
    comm = open_comm(rank, world, store, **opts)
    try:
        x = make_input(rank, 1024, torch.float32)
        want = reference_reduce([make_input(r, 1024, torch.float32) for r in range(world)], "sum")
        exact = bits_equal(comm.all_reduce(x.clone()), want)

        def sample():
            c = comm.counters()
            return (c["watchdog_passes"], c["caller_watchdog_passes"], _thread_switches()["r2cc-watchdog"],
                    time.monotonic(), c["spin_hits"], c["spin_misses"], c["spin_skips"])

        def delta(a, b):
            return {"passes": b[0] - a[0], "by_callers": b[1] - a[1], "watchdog_wakeups": b[2] - a[2], "s": b[3] - a[3],
                    "spin_hits": b[4] - a[4], "spin_misses": b[5] - a[5], "spin_skips": b[6] - a[6]}
        store_barrier(store, "busy", rank, world)
        start, calls = sample(), 0
        while True:  # every rank makes the same calls: rank 0's clock decides when to stop
            for _ in range(50):
                t = time.perf_counter()
                while rank == 1 and time.perf_counter() - t < late_s:
                    pass
                exact &= bits_equal(comm.all_reduce(x.clone()), want)
            calls += 50
            if rank == 0:
                store.set(f"more/{calls}", "1" if time.monotonic() - start[3] < phase_s else "0")
            if bytes(store.get(f"more/{calls}")) == b"0":
                break
        busy = delta(start, sample())
        start = sample()
        time.sleep(phase_s)
        idle = delta(start, sample())
        store_barrier(store, "idle", rank, world)
        return {"exact": exact, "calls": calls, "busy": busy, "idle": idle}
    finally:
        comm.close()


def idle_thread_wakeups(rank, world, store, opts):
    """How often each r2cc thread wakes in a second with every rail up and no traffic (the rail
    monitor's too, writing a status file, as in a serving rank); then rail 2 fails and must
    come back (the connector, asleep, is told to dial)."""
    import shutil
    import tempfile

    from r2cc_serve.health.monitor import RailMonitor

    comm = open_comm(rank, world, store, **opts)
    status_dir = tempfile.mkdtemp(prefix="r2cc-idle-status-")
    monitor = RailMonitor(comm, "idle", rank, rank, status_dir, 0.1, "loopback", state_dir="").start()
    try:
        x = make_input(rank, 1 << 20, torch.float32)
        want = reference_reduce([make_input(r, 1 << 20, torch.float32) for r in range(world)], "sum")
        exact = bits_equal(comm.all_reduce(x.clone()), want)
        time.sleep(0.2)
        monitor_tid = monitor._thread.native_id
        # Wake-ups are what is counted (voluntary switches: each one a sleep that ended). A busy
        # host also preempts these threads while they run, as often as it likes: 5.99 switches a
        # second of the monitor's failed a fresh-clone CI run on a busy box with both kinds summed.
        def switches(wakeups_only):
            return {**_thread_switches(wakeups_only), "r2cc-monitor": _task_switches(monitor_tid, wakeups_only)}
        before, before_all, t0 = switches(True), switches(False), time.monotonic()
        time.sleep(1.0)
        after, after_all = switches(True), switches(False)
        idle_s = time.monotonic() - t0
        per_s = {k: (after[k] - before.get(k, 0)) / idle_s for k in after}
        preempted_per_s = {k: (after_all[k] - before_all.get(k, 0)) / idle_s - per_s[k] for k in after}
        idle_rtt = [s["rtt_s"] for s in comm.rail_stats()]  # from heartbeat echoes only: no traffic
        store_barrier(store, "idle", rank, world)
        if rank == 1:
            comm.inject_failure(0, 2, after_chunks=1)
        exact &= bits_equal(comm.all_reduce(x.clone()), want)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10 and next(s for s in comm.rail_stats() if s["rail"] == 2)["state"] != "up":
            time.sleep(0.01)
        rail2 = next(s for s in comm.rail_stats() if s["rail"] == 2)
        store_barrier(store, "back", rank, world)
        return {"per_s": per_s, "preempted_per_s": preempted_per_s, "exact": exact, "rail2": rail2["state"], "reconnects": rail2["reconnects"],
                "back_s": time.monotonic() - t0, "idle_rtt_s": idle_rtt}
    finally:
        monitor.stop()
        comm.close()
        shutil.rmtree(status_dir, ignore_errors=True)
