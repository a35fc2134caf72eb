"""Rank functions for gray failures in the fault lab: rail 1 of host 0 passes small frames but
not full-size ones (or drops most full-size ones at random), while the ranks run all_reduces or
sit idle. Rank r's rails live in lab host r; rank 0 applies and clears the fault in-process
(an `nft` process start can take longer than a collective on a busy box)."""

from __future__ import annotations

import threading
import time

import torch

from tests.comm.harness import close_after_barrier, store_barrier
from tests.comm.lab_workers import _warmed_up_inputs, lab_comm
from tests.comm.workers import bits_equal

GRAY_RAIL = 1


def _gray_fault(lab, variant: str):
    """apply() and clear() for a fault `variant` in the fault notation's KIND[:ARGS] ('gray',
    'gray:out', 'marginal:90') on host 0's rail GRAY_RAIL, in-process through nftables, and close().
    'degrade:RATE' is a rate cut (a rail that still delivers, slowly), through the lab's tc."""
    if variant.startswith("degrade:"):
        rate = variant.split(":", 1)[1]
        return (lambda: lab.fault(0, GRAY_RAIL, "degrade", rate)), (lambda: lab.fault(0, GRAY_RAIL, "clear")), None
    from r2cc_testbed.faults.model import parse_fault_text
    from r2cc_testbed.lab.layout import Layout
    from r2cc_testbed.lab.nft_rules import clear_scripts, fault_scripts
    from r2cc_testbed.faults.inprocess_executor import NftInNamespaces

    layout = Layout(lab.prefix, lab.hosts, lab.rails)
    on = fault_scripts(layout, parse_fault_text(f"h0:{GRAY_RAIL}:{variant}"))
    off = clear_scripts(layout, 0, GRAY_RAIL)
    nft = NftInNamespaces(sorted({ns for ns, _ in on + off}))

    def run(scripts):
        for ns, script in scripts:
            nft.run(ns, script)
    return (lambda: run(on)), (lambda: run(off)), nft.close


def _rail_view(comm, rail=GRAY_RAIL):
    s = next(s for s in comm.rail_stats() if s["rail"] == rail)
    return {k: s.get(k, 0) for k in ("state", "failovers", "stuck_suspects", "slow_suspects", "mute_suspects",
                                     "last_detect_s", "last_error", "flap_failures", "holds", "reconnects")}


def _watch_detection(comm, t_fault, out, stop):
    """Records when this rank first set the gray rail aside (any gray count moved, or it left 'up')."""
    base = _rail_view(comm)
    while not stop.is_set():
        v = _rail_view(comm)
        moved = any(v[k] > base[k] for k in ("stuck_suspects", "mute_suspects", "slow_suspects", "failovers"))
        if moved or v["state"] != "up":
            out["detected_s"] = time.monotonic() - t_fault[0] if t_fault[0] else None
            out["detected_as"] = v
            return
        time.sleep(0.002)


def gray_under_load(rank, world, store, variant, load, fault_s=2.0, mib=4, opts=None):
    """`load`: 'bulk' (mib MiB all_reduces back to back for fault_s, the fault landing mid-call)
    or 'idle' (no collectives for a second after the fault: only heartbeats and probes cross the
    rail; then all_reduces resume). Returns exactness, call times, when this rank set the rail
    aside, and the rail's stats after the fault was cleared and the rail came back."""
    lab, comm = lab_comm(rank, world, store, **(opts or {}))
    apply = clear = close = None
    out = {"exact": True}
    try:
        inputs, want = _warmed_up_inputs(comm, rank, world, (mib << 20) // 4)
        if rank == 0:
            apply, clear, close = _gray_fault(lab, variant)
        t_fault, stop = [0.0], threading.Event()
        watcher = threading.Thread(target=_watch_detection, args=(comm, t_fault, out, stop), daemon=True)
        times = []

        def call():
            t = time.monotonic()
            out["exact"] &= bits_equal(comm.all_reduce(inputs[rank].clone()), want)
            times.append(time.monotonic() - t)

        for _ in range(5):
            call()
        store_barrier(store, "go", rank, world)
        watcher.start()
        if load == "idle":
            store_barrier(store, "apply", rank, world)
            t_fault[0] = time.monotonic()  # each rank's own clock; the barrier aligns them to ~1 ms
            if rank == 0:
                apply()
            time.sleep(1.0)
            store_barrier(store, "idle-done", rank, world)
        else:
            flag = torch.zeros(1)
            started = time.monotonic()
            scheduled = False
            while True:  # rank 0 applies the fault 20 ms into a call; the ranks agree when to stop
                # Once: a call shorter than the timer's 20 ms started a second one, and two threads
                # in libnftables at once crashed rank 0 (SIGSEGV, 2 of ~20 runs on a busy box).
                if rank == 0 and not scheduled and len(times) >= 10:
                    scheduled = True
                    threading.Timer(0.02, lambda: (t_fault.__setitem__(0, time.monotonic()), apply())).start()
                call()
                flag[0] = 1.0 if time.monotonic() - started > fault_s and len(times) >= 20 else 0.0
                comm.all_reduce(flag)
                if flag[0] >= world:
                    break
            if rank == 1:
                t_fault[0] = t_fault[0] or started  # rank 1 knows no fault time: detection is rank 0's figure
        for _ in range(5):
            call()
        stop.set()
        watcher.join(5)
        out["during"] = _rail_view(comm)
        out["counters"] = {k: v for k, v in comm.counters().items() if k in ("gray_suspects", "probes", "failovers",
                                                                           "chunks_resent", "bytes_resent", "own_stalls")}
        store_barrier(store, "measured", rank, world)
        if rank == 0:
            clear()
        store_barrier(store, "cleared", rank, world)
        # Back in service: a held rail waits out its hold; others are up within a few probes.
        t1 = time.monotonic()
        while _rail_view(comm)["state"] not in ("up",) and time.monotonic() - t1 < 30:
            time.sleep(0.05)
        out["back_s"] = time.monotonic() - t1
        out["after"] = _rail_view(comm)
        store_barrier(store, "back", rank, world)
        sent0 = next(s for s in comm.rail_stats() if s["rail"] == GRAY_RAIL)["bytes_sent"]
        for _ in range(3):
            call()
        out["sent_after"] = next(s for s in comm.rail_stats() if s["rail"] == GRAY_RAIL)["bytes_sent"] - sent0
        ordered = sorted(times)
        out["calls"] = len(times)
        out["p50_s"] = ordered[len(ordered) // 2]
        out["max_s"] = ordered[-1]
        out["times_ms"] = [round(t * 1000) for t in times]
        return out
    finally:
        if close:
            close()
        close_after_barrier(comm, store, "end", rank, world)
