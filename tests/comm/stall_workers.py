"""Rank functions for stalled peers, idle outages and mismatched calls (spawned: top-level)."""

from __future__ import annotations

import os
import signal
import threading
import time

import torch

from tests.comm.workers import bits_equal, make_input, open_comm, reference_reduce
from tests.comm.harness import close_after_barrier, store_barrier



def _pids_and_inputs(rank, world, store, sizes):
    """Publishes this rank's pid (rank 0 stops rank 1 by it); every rank's input of each size and
    their sum; returns once every rank is there."""
    store.set(f"pid/{rank}", str(os.getpid()))
    inputs = {n: [make_input(r, n, torch.float32) for r in range(world)] for n in sizes}
    wants = {n: reference_reduce(v, "sum") for n, v in inputs.items()}
    store_barrier(store, "go", rank, world)
    return sizes, inputs, wants


def stopped_peer(rank, world, store, stop_s, opts):
    """Rank 0 stops rank 1 (SIGSTOP) for stop_s while both run 4 KiB and 1 MiB all_reduces.

    A stopped process is not a dead network: nothing may fail over or abort, the results stay
    exact, and rank 0 reports rank 1 as stalled (with its rails still up) while it lasts."""
    comm = open_comm(rank, world, store, **opts)
    try:
        sizes, inputs, wants = _pids_and_inputs(rank, world, store, (1024, 1 << 18))
        seen = {}
        if rank == 0:
            victim = int(store.get("pid/1"))

            def stop_and_go():
                os.kill(victim, signal.SIGSTOP)
                try:
                    time.sleep(stop_s * 0.8)
                    stalled = [p for p in comm.peer_stats() if p["peer"] == 1][0]
                    seen.update(stalled=stalled, states=sorted({s["state"] for s in comm.rail_stats()}))
                    time.sleep(stop_s * 0.2)
                finally:
                    os.kill(victim, signal.SIGCONT)

            stopper = threading.Thread(target=stop_and_go)
            stopper.start()
        bad = done = 0
        t0 = time.time()
        # Rank 0's clock alone decides when to stop, and every round carries its verdict: two
        # ranks reading their own clocks can disagree on the round count by one and leave one
        # rank waiting in a collective the other never makes.
        keep_going = torch.ones(1, dtype=torch.int32)
        while True:
            keep_going.fill_(int(rank == 0 and time.time() - t0 < stop_s + 1.5))
            if not int(comm.all_reduce(keep_going.clone(), op="max")[0]):
                break
            n = sizes[done % 2]
            bad += not bits_equal(comm.all_reduce(inputs[n][rank].clone()), wants[n])
            done += 1
        if rank == 0:
            stopper.join()
        store_barrier(store, "end", rank, world)
        stats = comm.rail_stats()
        peer = comm.peer_stats()
        return {"bad": bad, "done": done, "failovers": sum(s["failovers"] for s in stats),
                "resent": sum(s["chunks_resent"] for s in stats), "states": sorted({s["state"] for s in stats}),
                "seen": seen, "stalls": sum(p["stalls"] for p in peer),
                "last_stall_s": max(p["last_stall_s"] for p in peer), "error": comm.error()}
    finally:
        close_after_barrier(comm, store, "read", rank, world)


def idle_outage_heals(rank, world, store, outage_s, opts):
    """Rank 0 fails over every rail while no collective runs, longer than the grace period,
    then restores them: nothing fails, and the next collectives are exact."""
    comm = open_comm(rank, world, store, **opts)
    try:
        x = [make_input(r, 1 << 16, torch.float32) for r in range(world)]
        want = reference_reduce(x, "sum")
        ok = bits_equal(comm.all_reduce(x[rank].clone()), want)
        store_barrier(store, "idle", rank, world)
        if rank == 0:
            for rail in range(comm.num_rails):
                comm.failover_rail(rail)
        time.sleep(outage_s)
        no_path = [p["has_path"] for p in comm.peer_stats()]
        error_during = comm.error()
        if rank == 0:
            for rail in range(comm.num_rails):
                comm.restore_rail(rail)
        store_barrier(store, "restored", rank, world)
        ok = all(bits_equal(comm.all_reduce(x[rank].clone()), want) for _ in range(20)) and ok
        return {"ok": ok, "had_path_during": no_path, "error_during": error_during, "error": comm.error()}
    finally:
        comm.close()


MISMATCHES = {
    # name: (rank 0's call, rank 1's call) as (method, args) over fresh tensors
    "dtype": (("all_reduce", torch.float32, 100, {}), ("all_reduce", torch.int32, 100, {})),
    "dtype_and_count": (("all_reduce", torch.float32, 100, {}), ("all_reduce", torch.float16, 200, {})),
    "op": (("all_gather", torch.float32, 200, {}), ("reduce_scatter", torch.float32, 400, {})),
    "reduce_op": (("all_reduce", torch.float32, 100, {"op": "sum"}), ("all_reduce", torch.float32, 100, {"op": "max"})),
    "root": (("broadcast", torch.float32, 100, {"src": 0}), ("broadcast", torch.float32, 100, {"src": 1})),
}


def mismatched_call(rank, world, store, case, opts):
    """Ranks make different calls whose bytes match; every rank must get CallMismatchError
    (from that call or, when it could return correctly on its own, the next one), fast."""
    from r2cc_serve.errors import CallMismatchError

    comm = open_comm(rank, world, store, **opts)
    try:
        comm.all_reduce(torch.ones(8))  # a good call first: numbering starts in step
        method, dtype, n, kw = MISMATCHES[case][rank]
        t = (torch.arange(n) + rank).to(dtype)
        store_barrier(store, "go", rank, world)
        t0 = time.time()
        raised_by = None
        returned = None
        try:
            returned = getattr(comm, method)(t, **kw)
            comm.all_reduce(torch.ones(8))
        except CallMismatchError as exc:
            raised_by = "call" if returned is None else "next"
            return {"raised": raised_by, "after_s": time.time() - t0, "msg": str(exc), "kind": comm.error_kind()}
        except Exception as exc:
            return {"raised": type(exc).__name__, "after_s": time.time() - t0, "msg": str(exc)}
        return {"raised": None, "returned": returned.tolist()[:4]}
    finally:
        comm.close()


def handoff_to_writer(rank, world, store, fail_carrier, opts):
    """Rank 0 sends 48 MiB to rank 1 while rank 1 is stopped; rank 0's calling thread writes
    a 16 MiB chunk itself on rail 1 (inject_full_socket: no room check), more than the socket and
    the stopped peer's kernel take, and the rail's writer must finish it: a caller never waits
    on a socket. With fail_carrier, rank 0 fails rail 1 while the hand-off waits (rank 1 still
    stopped): the chunk goes to another rail. Either way rank 1 gets the bytes exact."""
    n = 12 << 20  # float32: 48 MiB in 16 MiB chunks (send buffers top out at 4 MiB, receive at 6)
    comm = open_comm(rank, world, store, chunk_bytes=16 << 20, min_chunk_bytes=16 << 20, window_bytes=32 << 20,
                     **opts)
    try:
        store.set(f"pid/{rank}", str(os.getpid()))
        want = make_input(0, n, torch.float32)
        comm.all_reduce(torch.ones(4))
        store_barrier(store, "go", rank, world)
        seen = {}
        if rank == 1:
            got = comm.recv(torch.empty(n), 0)
            ok = bits_equal(got, want)
        else:
            victim = int(store.get("pid/1"))
            os.kill(victim, signal.SIGSTOP)
            time.sleep(0.2)  # the signal has landed: rank 1 reads nothing now
            comm.inject_full_socket(1, 1)

            def watch_then_go():
                try:
                    time.sleep(0.5)
                    seen.update(handoffs=comm.counters()["handoffs"],
                                carriers=[s["rail"] for s in comm.rail_stats() if s["inflight_bytes"]])
                    if fail_carrier:
                        comm.failover_rail(1)
                        time.sleep(0.3)
                        seen["after_failover"] = [s["rail"] for s in comm.rail_stats() if s["inflight_bytes"]]
                finally:
                    os.kill(victim, signal.SIGCONT)

            t = threading.Thread(target=watch_then_go)
            t.start()
            t0 = time.time()
            comm.send(want, 1)
            seen["send_s"] = time.time() - t0
            t.join()
            ok = True
            if fail_carrier:
                comm.restore_rail(1)
        after = comm.all_reduce(torch.ones(1 << 16))  # the group goes on
        return {"ok": ok, "after_ok": bool((after == world).all()), "seen": seen, **comm.counters(),
                "error": comm.error()}
    finally:
        comm.close()


def repeated_stops(rank, world, store, cycles, stop_s, in_lab, opts):
    """Rank 0 stops rank 1 (SIGSTOP) `cycles` times for stop_s each while both run all_reduces.

    Each resume is a race: rank 1's rails speak again one by one, within a few ms. A rail that
    spoke last was quiet for the whole stop, but so was every other: that is no gray failure,
    and nothing may be set aside or re-sent. in_lab: rank r's rails in lab host r (veth, shaped)."""
    if in_lab:
        from tests.comm.lab_workers import lab_comm

        comm = lab_comm(rank, world, store, **opts)[1]
    else:
        comm = open_comm(rank, world, store, **opts)
    try:
        sizes, inputs, wants = _pids_and_inputs(rank, world, store, (1024, 1 << 16))
        if rank == 0:
            victim = int(store.get("pid/1"))

            def stop_and_go():
                for _ in range(cycles):
                    time.sleep(0.15)
                    os.kill(victim, signal.SIGSTOP)
                    try:
                        time.sleep(stop_s)
                    finally:
                        os.kill(victim, signal.SIGCONT)

            stopper = threading.Thread(target=stop_and_go)
            stopper.start()
        bad = done = 0
        keep_going = torch.ones(1, dtype=torch.int32)
        while True:
            keep_going.fill_(int(rank == 0 and stopper.is_alive()))
            if not int(comm.all_reduce(keep_going.clone(), op="max")[0]):
                break
            n = sizes[done % 2]
            bad += not bits_equal(comm.all_reduce(inputs[n][rank].clone()), wants[n])
            done += 1
        store_barrier(store, "end", rank, world)
        stats = comm.rail_stats()
        return {"bad": bad, "done": done, "failovers": sum(s["failovers"] for s in stats),
                "resent": sum(s["chunks_resent"] for s in stats),
                "gray": sum(s["stuck_suspects"] + s["mute_suspects"] + s["slow_suspects"] for s in stats),
                "loss_holds": sum(s["loss_holds"] for s in stats),
                "errors": sorted({s["last_error"] for s in stats if s["last_error"]}), "error": comm.error()}
    finally:
        close_after_barrier(comm, store, "read", rank, world)
