"""Runs one function in `world` spawned processes, one per rank, joined by a TCPStore.

The function gets (rank, world, store, *args) and returns something picklable;
run_ranks returns the results ordered by rank, or raises with every rank's error.
Every process has a deadline: a hang fails the test instead of blocking CI.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import random
import socket
import threading
import traceback


def free_port() -> int:
    """A port for a server started later. Drawn below the kernel's ephemeral range: a port the
    kernel handed out (bind to 0) may be taken again by any outgoing connection before the
    server binds it, and on a busy box one was (TCPStore failed with 'address in use'). Not in
    R2CC_PORT_RANGE either, where r2cc's own listeners may take it first."""
    from r2cc_serve import envs

    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    first, last = envs.get("R2CC_PORT_RANGE")
    for _ in range(200):
        port = random.randrange(10000, max(low, 10001))
        if first <= port <= last:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range after 200 tries")


def store_barrier(store, name: str, rank: int, world: int) -> None:
    """Every rank reaches `name` before any goes on (the store's get blocks until the key is
    set, under the store's own timeout). Each name is used once per run."""
    store.set(f"{name}/{rank}", "1")
    for r in range(world):
        store.get(f"{name}/{r}")


def close_after_barrier(comm, store, name: str, rank: int, world: int) -> None:
    """Close the group only once every rank has reached `name`: a peer that closes first takes
    the rails down under a rank still reading them (CI on a busy box: rank 0 read every rail
    "down" with no failover counted)."""
    store_barrier(store, name, rank, world)
    comm.close()


def _child(fn, rank, world, port, args, q):
    from torch.distributed import TCPStore

    try:
        store = TCPStore("127.0.0.1", port, world, False, timeout=datetime.timedelta(seconds=60))
        q.put((rank, True, fn(rank, world, store, *args)))
    except BaseException as exc:  # report everything, the parent decides
        q.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def run_ranks(fn, world: int, *args, timeout: float = 120.0, start_method: str = "spawn"):
    """start_method "fork" spares each rank importing torch again (in the emulated RDMA guest
    an import takes over a minute); "spawn" is the default: nothing of the parent leaks in."""
    ctx = mp.get_context(start_method)
    q = ctx.Queue()
    from torch.distributed import TCPStore

    # The parent holds the store on a port the kernel picks at bind time: nothing can race it.
    master = TCPStore("127.0.0.1", 0, world, True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=60))
    port = master.port
    procs = [ctx.Process(target=_child, args=(fn, r, world, port, args, q), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    results, errors = {}, {}
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=timeout)
    try:
        while len(results) + len(errors) < world:
            left = (deadline - datetime.datetime.now()).total_seconds()
            if left <= 0:
                raise TimeoutError(f"ranks {sorted(set(range(world)) - set(results) - set(errors))} did not finish "
                                   f"within {timeout} s; finished: {sorted(results)}; errors: {errors}")
            try:
                rank, ok, val = q.get(timeout=min(left, 1.0))
            except Exception:
                if all(not p.is_alive() for p in procs) and q.empty():
                    raise RuntimeError(f"ranks died without a result: exit codes {[p.exitcode for p in procs]}")
                continue
            (results if ok else errors)[rank] = val
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    if errors:
        raise AssertionError("rank errors:\n" + "\n".join(f"rank {r}: {e}" for r, e in sorted(errors.items())))
    return [results[r] for r in range(world)]


def run_in_threads(fn, world: int = 2, timeout: float = 60.0) -> list:
    """fn(rank) in one thread of this process per rank; the results by rank. The first rank's
    error is raised here, not lost in its thread; a rank still running after `timeout` fails."""
    out, errors = [None] * world, []

    def run(rank):
        try:
            out[rank] = fn(rank)
        except Exception as exc:  # noqa: BLE001 - raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), f"a rank did not finish within {timeout} s"
    if errors:
        raise errors[0]
    return out
