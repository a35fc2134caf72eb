"""Rank functions for the fault stress: rails of both hosts fail and come back, in every way the
lab knows (link down, blackhole, gray each way, marginal, lossy), one after another and at most
two rails at a time, while the ranks run all_reduces of mixed sizes. Every result is checked bit
for bit and the transport's books are audited after every call (audit_books: every chunk
acknowledged, queued or in flight on the rail that carries it)."""

from __future__ import annotations

import random
import threading
import time

import torch

from tests.comm.harness import close_after_barrier, store_barrier
from tests.comm.lab_workers import lab_comm
from tests.comm.workers import bits_equal, make_input, reference_reduce

SIZES = [1 << 10, 16 << 10, 256 << 10, 1 << 20, 4 << 20]  # floats per all_reduce: 4 KiB .. 16 MiB
FAULTS = ["blackhole", "gray", "gray:out", "gray:in", "marginal:90", "lossy:5", "down"]


def _fault_loop(lab, stop, seed, log):
    """Rank 0's fault thread: on a random host and rail, a random fault for 0.2-1.5 s, then clear and
    a pause; never more than two rails broken at once (there is always a path)."""
    from r2cc_testbed.faults.model import parse_fault_text
    from r2cc_testbed.lab.layout import Layout
    from r2cc_testbed.lab.nft_rules import clear_scripts, fault_scripts
    from r2cc_testbed.faults.inprocess_executor import LinkSwitch, NftInNamespaces

    rng = random.Random(seed)
    layout = Layout(lab.prefix, lab.hosts, lab.rails)
    spaces = [layout.host_ns(h) for h in range(lab.hosts)]
    nft, links = NftInNamespaces(spaces), LinkSwitch(spaces)
    broken: dict[tuple[int, int], float] = {}  # (host, rail) -> clear at

    def clear(host, rail):
        for ns, script in clear_scripts(layout, host, rail):
            nft.run(ns, script)
        links.set_up(layout.host_ns(host), layout.rail_ifname(rail), True)

    try:
        while not stop.is_set():
            now = time.monotonic()
            for key, until in list(broken.items()):
                if now >= until:
                    clear(*key)
                    del broken[key]
            if len(broken) < 2 and rng.random() < 0.5:
                host, rail = rng.randrange(lab.hosts), rng.randrange(lab.rails)
                if all(r != rail for _, r in broken):
                    kind = rng.choice(FAULTS)
                    if kind == "down":
                        links.set_up(layout.host_ns(host), layout.rail_ifname(rail), False)
                    else:
                        for ns, script in fault_scripts(layout, parse_fault_text(f"h{host}:{rail}:{kind}")):
                            nft.run(ns, script)
                    broken[(host, rail)] = now + rng.uniform(0.2, 1.5)
                    log.append(f"{now:.2f} h{host} rail{rail} {kind}")
            stop.wait(0.25)
    finally:
        for key in list(broken):
            clear(*key)
        nft.close()
        links.close()


def faults_under_mixed_collectives(rank, world, store, seconds, seed, opts=None):
    """All_reduces of sizes drawn from SIZES (the same draw on every rank) for `seconds` while rank
    0's thread breaks and mends rails. Returns calls, inexact results, books breaches, the slowest
    call by size, the faults injected and the transport's counters."""
    lab, comm = lab_comm(rank, world, store, **(opts or {}))
    rng = random.Random(seed)
    inputs = {n: [make_input(r, n, torch.float32) for r in range(world)] for n in SIZES}
    wants = {n: reference_reduce(inputs[n], "sum") for n in SIZES}
    stop, log, fault_thread = threading.Event(), [], None
    out = {"calls": 0, "inexact": 0, "breaches": [], "slowest_s": {}, "faults": log}
    try:
        for n in SIZES:
            comm.all_reduce(inputs[n][rank].clone())
        store_barrier(store, "go", rank, world)
        if rank == 0:
            fault_thread = threading.Thread(target=_fault_loop, args=(lab, stop, seed, log), daemon=True)
            fault_thread.start()
        t0, flag = time.monotonic(), torch.zeros(1)
        while True:
            n = rng.choice(SIZES)
            t = time.monotonic()
            got = comm.all_reduce(inputs[n][rank].clone())
            took = time.monotonic() - t
            out["calls"] += 1
            out["inexact"] += not bits_equal(got, wants[n])
            out["slowest_s"][n] = max(out["slowest_s"].get(n, 0.0), took)
            out["breaches"] += comm._t.audit_books()
            flag[0] = 1.0 if time.monotonic() - t0 > seconds else 0.0
            comm.all_reduce(flag)  # every rank stops after the same call
            if flag[0] >= world:
                break
        stop.set()
        if fault_thread:
            fault_thread.join(10)
        out["seconds"] = time.monotonic() - t0
        out["counters"] = {k: v for k, v in comm.counters().items()
                           if k in ("failovers", "chunks_resent", "gray_suspects", "holds", "loss_holds", "probes")}
        store_barrier(store, "stopped", rank, world)
        # Mended: every rail back in service within its hold, and the books still sound.
        t1 = time.monotonic()
        while any(s["state"] != "up" for s in comm.rail_stats()) and time.monotonic() - t1 < 60:
            time.sleep(0.1)
        out["states"] = {s["rail"]: s["state"] for s in comm.rail_stats()}
        out["breaches"] += comm._t.audit_books()
        store_barrier(store, "mended", rank, world)
        return out
    finally:
        stop.set()
        close_after_barrier(comm, store, "end", rank, world)
