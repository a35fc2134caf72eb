"""The bench's tcp-floor ring on loopback: correct sums for awkward sizes, a bounded wait."""

from __future__ import annotations

import datetime
import multiprocessing as mp

import pytest
import torch

RAILS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]


def _rank(rank, world, port, sizes, skip_rank, q):
    from torch.distributed import TCPStore

    from r2cc_serve.bench.tcp_floor import FloorError, TcpRing
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
    try:
        ring = TcpRing(rank, world, store, RAILS, timeout_s=3.0 if skip_rank is not None else 30.0)
        out = []
        for n in sizes:
            t = torch.arange(n, dtype=torch.float32) * (rank + 1) + rank
            if rank != skip_rank:
                ring.all_reduce(t)
            out.append(t)
        q.put((rank, "ok", out))
        store.wait(["done"])  # keep the sockets open until every rank has finished
        ring.close()
    except FloorError as exc:
        q.put((rank, "error", str(exc)))
        store.wait(["done"])


def _run(world, sizes, skip_rank=None):
    from torch.distributed import TCPStore
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=_rank, args=(r, world, master.port, sizes, skip_rank, q)) for r in range(world)]
    for p in ps:
        p.start()
    try:
        got = dict((r, (kind, val)) for r, kind, val in (q.get(timeout=60) for _ in range(world)))
    finally:
        master.set("done", "1")
        for p in ps:
            p.join(timeout=20)
            if p.is_alive():
                p.kill()
    return got


def test_ring_sums_every_size_on_every_rank():
    world, sizes = 3, [1, 2, 5, 1000, 262147]  # fewer elements than ranks, odd splits, several chunks
    got = _run(world, sizes)
    for r in range(world):
        kind, out = got[r]
        assert kind == "ok", out
        for n, t in zip(sizes, out):
            base = torch.arange(n, dtype=torch.float32)
            want = sum(base * (q + 1) + q for q in range(world))
            torch.testing.assert_close(t, want, rtol=1e-6, atol=0)


def test_a_rank_that_never_joins_is_a_named_timeout_not_a_hang():
    got = _run(3, [4096], skip_rank=2)
    for r in (0, 1):
        kind, msg = got[r]
        assert kind == "error" and "did not finish within 3 s" in msg and "no failover" in msg, msg
