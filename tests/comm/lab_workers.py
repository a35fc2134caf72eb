"""Rank functions for the fault-lab tests: rank r's rails live in lab host r.

Faults are real kernel events injected by rank 0 through the lab API (link down,
nftables blackhole, tbf rate cut), timed against the running collective.
"""

from __future__ import annotations

import threading
import time

import torch

from tests.comm.workers import bits_equal, make_input, mid_size_chunk_writers, open_comm, reference_reduce
from tests.comm.harness import close_after_barrier, store_barrier


def _lab():
    from r2cc_testbed.lab import Lab

    return Lab.load()


def lab_comm(rank, world, store, **opts):
    lab = _lab()
    rails = [lab.rail_ifname(k) for k in range(lab.rails)]
    return lab, open_comm(rank, world, store, rails=rails, netns=lab.host_ns(rank), group="lab", **opts)



def _totals(comm):
    st = comm.rail_stats()
    return {"failovers": sum(s["failovers"] for s in st), "resent_bytes": sum(s["bytes_resent"] for s in st),
            "states": {s["rail"]: s["state"] for s in st},
            "sent_by_rail": [sum(s["bytes_sent"] for s in st if s["rail"] == k) for k in range(comm.num_rails)]}


def _warmed_up_inputs(comm, rank, world, n):
    """Every rank's input of n floats and their rank-order sum, after one all_reduce (connections
    warm, buffers grown)."""
    inputs = [make_input(r, n, torch.float32) for r in range(world)]
    want = reference_reduce(inputs, "sum")
    comm.all_reduce(inputs[rank].clone())
    return inputs, want


def _reduce_until(comm, world, inp, want, done) -> tuple[bool, int, float]:
    """all_reduces of inp, each checked bit for bit against want, until every rank's
    done(calls, seconds) held before the same call: a flag all_reduce after each call carries the
    ranks' verdicts, so every rank runs the same number of calls. (exact, calls, seconds)."""
    t0, calls, exact = time.monotonic(), 0, True
    while True:
        flag = torch.tensor([float(done(calls, time.monotonic() - t0))])
        exact &= bits_equal(comm.all_reduce(inp.clone()), want)
        comm.all_reduce(flag)
        calls += 1
        if flag[0] >= world:
            return exact, calls, time.monotonic() - t0


def _in_process_fault(lab, host, rail, kind):
    """apply() for a link-down or blackhole of host's end of rail, done in this process (an
    `ip`/`nft` process start can take longer than the whole collective on a busy box), and close()."""
    from r2cc_testbed.lab.layout import Layout
    from r2cc_testbed.lab.nft_rules import blackhole_script
    from r2cc_testbed.faults.inprocess_executor import LinkSwitch, NftInNamespaces

    layout = Layout(lab.prefix, lab.hosts, lab.rails)
    ns, dev = layout.link_ends(host, rail)[0]
    if kind == "down":
        links = LinkSwitch([ns])
        return (lambda: links.set_up(ns, dev, False)), links.close
    nft = NftInNamespaces([ns])
    script = blackhole_script(layout, rail, on=True)
    return (lambda: nft.run(ns, script)), nft.close


def _fault_while_in_flight(comm, apply, at_s, call_done, out):
    """`at_s` into the call, as soon as rail 1 holds chunks the peer has not acknowledged, apply():
    the fault then surely catches data on the wire, whatever the machine's load."""
    time.sleep(at_s)
    while not call_done.is_set():
        if any(s["rail"] == 1 and s["inflight_bytes"] > 0 for s in comm.rail_stats()):
            apply()
            out["inflight_at_fault"] = True
            return
        time.sleep(0.0005)
    out["inflight_at_fault"] = False


def fault_mid_collective(rank, world, store, kind, n, at_s):
    """A fault on host 0 rail 1 while it carries chunks of an all_reduce of n floats: result bit-exact."""
    lab, comm = lab_comm(rank, world, store)
    try:
        inputs, want = _warmed_up_inputs(comm, rank, world, n)
        apply, close_fault = _in_process_fault(lab, 0, 1, kind) if rank == 0 else (None, None)
        call_done, fault = threading.Event(), {}
        store_barrier(store, "go", rank, world)
        timer = threading.Thread(target=_fault_while_in_flight, args=(comm, apply, at_s, call_done, fault)) \
            if rank == 0 else None
        if timer:
            timer.start()
        t0 = time.perf_counter()
        got = comm.all_reduce(inputs[rank].clone())
        took = time.perf_counter() - t0
        call_done.set()
        if timer:
            timer.join()
            close_fault()
        during = _totals(comm)
        store_barrier(store, "measured", rank, world)
        if rank == 0:
            lab.fault(0, 1, "clear")
        # Re-admission: the rail comes back up (probing needs no traffic) and carries bytes again.
        deadline = time.time() + 15
        while time.time() < deadline and any(s != "up" for s in _totals(comm)["states"].values()):
            time.sleep(0.05)
        store_barrier(store, "readmitted", rank, world)
        before = _totals(comm)["sent_by_rail"][1]
        after = comm.all_reduce(inputs[rank].clone())
        return {"exact": bits_equal(got, want), "exact_after": bits_equal(after, want), "took": took,
                "during": during, "final_states": _totals(comm)["states"], **fault,
                "rail1_bytes_after": _totals(comm)["sent_by_rail"][1] - before}
    finally:
        close_after_barrier(comm, store, "end", rank, world)


def flap_during_many(rank, world, store, count, period_ms, flaps):
    """`count` collectives while rail 1 of host 0 flaps; every result bit-exact."""
    lab, comm = lab_comm(rank, world, store)
    try:
        sizes = [1024, 65536, 300000]
        inputs = {n: [make_input(r, n, torch.float32) for r in range(world)] for n in sizes}
        wants = {n: reference_reduce(v, "sum") for n, v in inputs.items()}
        store_barrier(store, "go", rank, world)
        flapper = lab.fault(0, 1, "flap", (period_ms, flaps), background=True) if rank == 0 else None
        bad = 0
        for i in range(count):
            n = sizes[i % len(sizes)]
            if not bits_equal(comm.all_reduce(inputs[n][rank].clone()), wants[n]):
                bad += 1
        if flapper:
            flapper.join(timeout=30)
        return {"bad": bad, **_totals(comm)}
    finally:
        close_after_barrier(comm, store, "end", rank, world)


def _chunk_while_rail_takes_chunks(comm, rail, within_s=5.0):
    """(rail_stats, the peer's bulk chunk) read while `rail` is up on both sides of the read. The
    chunk is worked out from the rails that take chunks at that instant: a rail set aside for a
    moment (a slow verdict, its backlog not yet delivered) leaves the fast ones, whose chunk is
    larger. A rail still not up after within_s is returned as it is, for the test to report."""
    deadline = time.monotonic() + within_s
    while True:
        before = next(s for s in comm.rail_stats() if s["rail"] == rail)["state"]
        chunk = comm.peer_stats()[0]["chunk_bytes"]
        stats = comm.rail_stats()
        if (before == "up" and next(s for s in stats if s["rail"] == rail)["state"] == "up") or \
                time.monotonic() > deadline:
            return stats, chunk
        time.sleep(0.02)


def degrade_shifts_load(rank, world, store, rate, min_s=0.0):
    """Rail 1 cut to `rate`: results stay exact and the slow rail carries a small share. With
    min_s the calls go on that long, so loss detection judges a few windows of the cut rail (a rate
    cut overflows its queue once, a burst of retransmissions: not a lossy rail)."""
    lab, comm = lab_comm(rank, world, store)
    try:
        inputs, want = _warmed_up_inputs(comm, rank, world, 4 << 20)
        store_barrier(store, "go", rank, world)
        if rank == 0:
            lab.fault(0, 1, "degrade", rate)
        store_barrier(store, "degraded", rank, world)
        before = _totals(comm)["sent_by_rail"]
        exact, _, _ = _reduce_until(comm, world, inputs[rank], want, lambda calls, s: calls >= 3 and s >= min_s)
        after = _totals(comm)["sent_by_rail"]
        share = [a - b for a, b in zip(after, before)]
        stats, chunk = _chunk_while_rail_takes_chunks(comm, 1)
        bw = {s["rail"]: s["bandwidth_Bps"] for s in stats}
        rail1 = next(s for s in stats if s["rail"] == 1)
        store_barrier(store, "measured", rank, world)
        if rank == 0:
            lab.fault(0, 1, "clear")
        return {"exact": exact, "share": share, "bw": bw, "chunk": chunk,
                "loss_holds": rail1["loss_holds"], "state": rail1["state"], "retrans_pct": rail1["retrans_pct"],
                "hold_reason": rail1["hold_reason"]}
    finally:
        close_after_barrier(comm, store, "end", rank, world)


def slow_rail_quiet_bar(rank, world, store, rate):
    """Rail 1 cut to `rate` (its tbf queue then holds ~100 ms): once the kernel has measured
    those round trips, the time rail 1 may be quiet before it is suspect follows them, and
    traffic over the slow rail fails nothing over for silence. (The cut itself is a degrade
    fault: the first seconds after it may suspect the rail, as they should; and a rail this much
    slower than its siblings may be demoted by a slow verdict, which is counted apart; so may a
    stuck verdict, when the peer's ACKs wait behind its own data in its shaper's queue longer
    than the rail timeout: a verdict on progress, not silence.)"""
    lab, comm = lab_comm(rank, world, store)
    try:
        inputs, want = _warmed_up_inputs(comm, rank, world, 1 << 20)
        idle_bars = {s["rail"]: s["suspect_after_s"] for s in comm.rail_stats()}
        store_barrier(store, "go", rank, world)
        if rank == 0:
            lab.fault(0, 1, "degrade", rate)
        store_barrier(store, "degraded", rank, world)
        for _ in range(4):  # the onset: queues fill, round trips are learnt
            comm.all_reduce(inputs[rank].clone())
        store_barrier(store, "settled", rank, world)
        onset_failovers = _totals(comm)["failovers"]
        onset_slow = sum(s["slow_suspects"] for s in comm.rail_stats())
        onset_stuck = sum(s["stuck_suspects"] for s in comm.rail_stats())
        bars, stop = {k: [] for k in range(comm.num_rails)}, threading.Event()

        def sample():
            while not stop.is_set():
                for s in comm.rail_stats():
                    bars[s["rail"]].append(s["suspect_after_s"])
                time.sleep(0.01)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        exact = all(bits_equal(comm.all_reduce(inputs[rank].clone()), want) for _ in range(6))
        stop.set()
        sampler.join(5)
        totals = _totals(comm)
        store_barrier(store, "measured", rank, world)
        if rank == 0:
            lab.fault(0, 1, "clear")
        slow = sum(s["slow_suspects"] for s in comm.rail_stats()) - onset_slow
        stuck = sum(s["stuck_suspects"] for s in comm.rail_stats()) - onset_stuck
        return {"exact": exact, "idle_bars": idle_bars, "max_bar": {k: max(v) for k, v in bars.items()},
                "failovers": totals["failovers"] - onset_failovers, "onset_failovers": onset_failovers,
                "slow_verdicts": slow, "stuck_verdicts": stuck, "rail1_error": next(s for s in comm.rail_stats() if s["rail"] == 1)["last_error"]}
    finally:
        close_after_barrier(comm, store, "end", rank, world)


def all_rails_down(rank, world, store):
    """Every rail of host 0 goes down: every rank raises RailsDownError within 2 s."""
    from r2cc_serve.errors import RailsDownError

    lab, comm = lab_comm(rank, world, store)
    try:
        x = make_input(rank, 1 << 16, torch.float32)
        comm.all_reduce(x.clone())
        store_barrier(store, "go", rank, world)
        if rank == 0:
            for k in range(lab.rails):
                lab.fault(0, k, "down")
        t0 = time.time()
        try:
            for _ in range(2000):
                comm.all_reduce(x.clone())
                time.sleep(0.005)
            return {"raised": None}
        except RailsDownError as exc:
            return {"raised": "RailsDownError", "headline": str(exc).splitlines()[0], "after_s": time.time() - t0}
        except Exception as exc:
            return {"raised": type(exc).__name__, "headline": str(exc), "after_s": time.time() - t0}
    finally:
        if rank == 0:
            for k in range(lab.rails):
                lab.fault(0, k, "clear")
        comm.close()


def stranger_on_rail(rank, world, store):
    """A stranger connects to a rail port from inside the lab; it is rejected, nothing breaks."""
    import json
    import subprocess
    import sys

    lab, comm = lab_comm(rank, world, store)
    try:
        x = make_input(rank, 100000, torch.float32)
        want = reference_reduce([make_input(r, 100000, torch.float32) for r in range(world)], "sum")
        if rank == 0:
            ip, port = json.loads(store.get("r2cc/lab/addr/0").decode())[0]
            code = ("import socket;s=socket.create_connection(('%s',%d),timeout=2);s.recv(24);"
                    "s.sendall(b'CC2R'+b'\\x01\\x00\\x00\\x00'+b'x'*48);s.settimeout(2)\n"
                    "try: s.recv(16)\nexcept OSError: pass" % (ip, port))
            subprocess.run(["ip", "netns", "exec", lab.host_ns(1), sys.executable, "-c", code], check=True, timeout=20)
        ok = all(bits_equal(comm.all_reduce(x.clone()), want) for _ in range(5))
        return {"ok": ok, **comm.counters()}
    finally:
        close_after_barrier(comm, store, "end", rank, world)


def small_messages_through_blackhole(rank, world, store, hedge_bytes, count, fault_at):
    """`count` decode-sized (4 KiB) all_reduces; after `fault_at` of them host 0's rail 1 drops
    every packet (no socket error: only the detector can tell, after the rail timeout, set to
    500 ms here). Returns whether every result was exact, the longest call after the fault,
    and the hedge copies and failovers counted. With hedging, a message lost on rail 1 has a
    copy on another rail and its call ends long before the detector would act."""
    lab, comm = lab_comm(rank, world, store, hedge_bytes=hedge_bytes, rail_timeout_ms=500, peer_silence_ms=1000)
    try:
        inputs, want = _warmed_up_inputs(comm, rank, world, 1024)
        apply, close_fault = _in_process_fault(lab, 0, 1, "blackhole") if rank == 0 else (None, None)
        store_barrier(store, "go", rank, world)
        exact, longest = True, 0.0
        for i in range(count):
            if i == fault_at and apply:
                apply()
            t0 = time.perf_counter()
            exact = bits_equal(comm.all_reduce(inputs[rank].clone()), want) and exact
            if i >= fault_at:
                longest = max(longest, time.perf_counter() - t0)
        counters = comm.counters()
        store_barrier(store, "measured", rank, world)
        if close_fault:
            close_fault()
            lab.fault(0, 1, "clear")
        return {"exact": exact, "longest_s": longest, "hedges": counters["hedges"],
                "failovers": counters["failovers"]}
    finally:
        close_after_barrier(comm, store, "end", rank, world)


def mid_size_after_small_messages(rank, world, store):
    _, comm = lab_comm(rank, world, store)
    try:
        return mid_size_chunk_writers(comm, rank, world)
    finally:
        comm.close()


def lossy_rail_is_held(rank, world, store, loss_pct, hold_s):
    """Rail 1 of host 0 loses loss_pct% of its packets each way under 4 MiB all_reduces: the rail
    is held for loss at both ends (the reason says so), it carries nothing while held, every
    result is exact; once the loss is cleared the hold runs out and the rail carries again."""
    lab, comm = lab_comm(rank, world, store, hold_s=hold_s)
    out = {"exact": True}
    try:
        inputs, want = _warmed_up_inputs(comm, rank, world, 1 << 20)
        store_barrier(store, "go", rank, world)
        if rank == 0:
            lab.fault(0, 1, "lossy", loss_pct)
        store_barrier(store, "lossy", rank, world)

        def rail1():
            return next(s for s in comm.rail_stats() if s["rail"] == 1)

        out["exact"], out["calls_to_hold"], out["held_after_s"] = _reduce_until(
            comm, world, inputs[rank], want, lambda calls, s: rail1()["state"] == "held" or s > 30)
        s = rail1()
        out["held"] = {k: s[k] for k in ("state", "hold_reason", "loss_holds", "retrans_pct")}
        sent0 = s["bytes_sent"]
        for _ in range(5):
            out["exact"] &= bits_equal(comm.all_reduce(inputs[rank].clone()), want)
        out["sent_while_held"] = rail1()["bytes_sent"] - sent0
        out["counters"] = comm.counters()
        store_barrier(store, "measured", rank, world)
        if rank == 0:
            lab.fault(0, 1, "clear")
        store_barrier(store, "cleared", rank, world)
        # The hold ends by itself once its time is up with no loss seen (the probes are clean now).
        t1 = time.monotonic()
        while rail1()["state"] != "up" and time.monotonic() - t1 < hold_s * 4 + 10:
            time.sleep(0.1)
        out["up_after_clear_s"] = time.monotonic() - t1
        store_barrier(store, "back", rank, world)
        sent1 = rail1()["bytes_sent"]
        out["exact"] &= bits_equal(comm.all_reduce(inputs[rank].clone()), want)
        out["sent_after"] = rail1()["bytes_sent"] - sent1
        return out
    finally:
        close_after_barrier(comm, store, "end", rank, world)
