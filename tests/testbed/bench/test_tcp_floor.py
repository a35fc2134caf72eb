"""The bench's tcp-floor ring on loopback: correct sums for awkward sizes, a bounded wait."""

from __future__ import annotations

import torch

from tests.comm.harness import run_ranks

RAILS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]


def ring_rank(rank, world, store, sizes, skip_rank):
    """Sums arange-based inputs of every size; `skip_rank` never calls all_reduce.
    Returns ("ok", outputs) or ("error", the FloorError's message)."""
    from r2cc_testbed.bench.tcp_floor import FloorError, TcpRing

    ring = TcpRing(rank, world, store, RAILS, timeout_s=3.0 if skip_rank is not None else 30.0)
    try:
        out = []
        for n in sizes:
            t = torch.arange(n, dtype=torch.float32) * (rank + 1) + rank
            if rank != skip_rank:
                ring.all_reduce(t)
            out.append(t.numpy())  # by value: a torch tensor is passed in shared memory, gone with the rank
        return "ok", out
    except FloorError as exc:
        return "error", str(exc)
    finally:
        # Sockets stay open until every rank is done: one closed early shows its peers an EOF,
        # not the timeout under test. The store's own timeout bounds this wait.
        store.set(f"done/{rank}", "1")
        store.wait([f"done/{r}" for r in range(world)])
        ring.close()


def test_ring_sums_every_size_on_every_rank():
    world, sizes = 3, [1, 2, 5, 1000, 262147]  # fewer elements than ranks, odd splits, several chunks
    for r, (kind, out) in enumerate(run_ranks(ring_rank, world, sizes, None, timeout=90)):
        assert kind == "ok", (r, out)
        for n, t in zip(sizes, out):
            base = torch.arange(n, dtype=torch.float32)
            want = sum(base * (q + 1) + q for q in range(world))
            torch.testing.assert_close(torch.from_numpy(t), want, rtol=1e-6, atol=0)


def test_a_rank_that_never_joins_is_a_named_timeout_not_a_hang():
    res = run_ranks(ring_rank, 3, [4096], 2, timeout=90)
    for kind, msg in res[:2]:
        assert kind == "error" and "did not finish within 3 s" in msg and "no failover" in msg, msg
