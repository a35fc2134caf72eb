"""A rank's process dies without a goodbye while its peer waits in a collective.

The doomed rank runs in a child process of its own (`python -m tests.comm.peer_gone_workers`), so
that it can die (os._exit) while the harness's process for that rank lives on to report. (The
harness's processes are daemons: multiprocessing would not let them have children.)
"""

from __future__ import annotations

import datetime
import os
import pathlib
import subprocess
import sys
import time

import torch

from tests.comm.workers import open_comm

GROUP = "gone"


def peer_process_dies(rank, world, store, victim):
    """Rank `victim` dies mid-run; every other rank returns what its waiting all_reduce raised."""
    if rank == victim:
        root = pathlib.Path(__file__).resolve().parents[2]
        proc = subprocess.run([sys.executable, "-m", "tests.comm.peer_gone_workers", str(rank), str(world), store.host,
                               str(store.port)], cwd=root, timeout=120, capture_output=True, text=True)
        return {"victim": True, "exitcode": proc.returncode, "stderr": proc.stderr[-2000:]}
    from r2cc_serve.errors import R2CCError

    comm = open_comm(rank, world, store, group=GROUP)
    try:
        x = torch.ones(1 << 10)
        comm.all_reduce(x.clone())  # every rank is up and connected
        store.set(f"survivor_waiting/{rank}", "1")
        t0 = time.time()
        try:
            comm.all_reduce(x.clone())  # the victim never joins this one: its process dies instead
            return {"raised": None}
        except R2CCError as exc:
            return {"raised": type(exc).__name__, "kind": exc.kind, "msg": str(exc), "after_s": time.time() - t0,
                    "rail_errors": [s["last_error"] for s in comm.rail_stats()]}
    finally:
        comm.close()


def _doomed_rank(rank, world, host, port):
    from torch.distributed import TCPStore

    store = TCPStore(host, port, world, False, timeout=datetime.timedelta(seconds=60))
    comm = open_comm(rank, world, store, group=GROUP)
    comm.all_reduce(torch.ones(1 << 10))
    for r in range(world):
        if r != rank:
            store.get(f"survivor_waiting/{r}")
    time.sleep(0.2)  # the survivors are inside their next all_reduce by now
    os._exit(0)  # no close(), no goodbye: the kernel closes (or resets) every rail connection


if __name__ == "__main__":
    _doomed_rank(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
