"""A rank whose group aborted, then exits: one process per rank (`python -m tests.comm.exit_workers`),
so that its exit code and what it printed at interpreter exit are its own (issue 49, item 4).

Each rank catches the group's error, prints its type, and exits 3; `how` says what it does first:
close: comm.close(); exit: nothing (the communicator is left to interpreter exit);
busy: nothing, and a daemon thread keeps calling into the communicator while the interpreter exits.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import threading
import time

import torch

from tests.comm.workers import open_comm

KINDS = ("timeout", "gone")


class _SlowTeardown:
    """Freed as the interpreter finalizes, which then takes a while, as a real program's teardown
    may (torch, a model's tensors): longer than the rail monitor's wait into the transport lasts
    (R2CC_STATUS_REFRESH_MS, 1 s), so that a thread still inside the transport comes back meanwhile."""

    def __del__(self):
        time.sleep(1.5)


def _keep_calling(comm) -> None:
    from r2cc_serve.errors import R2CCError

    x = torch.ones(16)
    while True:
        try:
            comm.all_reduce(x)
        except R2CCError:
            pass
        comm.rail_stats()


def _monitor_saw_it(comm) -> None:
    """Until the rail monitor has reported the group's error and gone back to its wait in the
    transport, where it spends its time (a process rarely exits the instant it fails)."""
    deadline = time.monotonic() + 20
    while comm.monitor and not comm.monitor.snapshot()["error"] and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)


def _abort(rank: int, comm, store, kind: str) -> None:
    """Raises the group's error on both ranks (the victim of `gone` dies instead)."""
    x = torch.ones(1 << 10)
    if kind == "timeout":
        if rank == 1:
            store.set("calling/1", "1")
            comm.all_reduce(x)  # rank 0 never joins: it times out after op_timeout_s
        else:
            store.get("calling/1")
            deadline = time.monotonic() + 30
            while not comm.error_kind() and time.monotonic() < deadline:  # rank 1's abort on its way
                time.sleep(0.05)
            comm.all_reduce(x)  # raises the group's error
    else:  # gone: rank 0's process is killed while rank 1 waits on it
        if rank == 1:
            store.set("calling/1", "1")
            comm.all_reduce(x)
        else:
            store.get("calling/1")
            time.sleep(0.3)  # rank 1 is inside its all_reduce by now
            os.kill(os.getpid(), signal.SIGKILL)


def main(rank: int, port: int, kind: str, how: str) -> None:
    from torch.distributed import TCPStore

    from r2cc_serve.errors import R2CCError

    global _teardown
    _teardown = _SlowTeardown()
    store = TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=60))
    # timeout: a wait fails after 2 s; gone: the dead peer, not the clock, ends rank 1's wait.
    comm = open_comm(rank, 2, store, group=f"exit-{kind}-{how}", op_timeout_s=2.0 if kind == "timeout" else 30.0)
    comm.all_reduce(torch.ones(1 << 10))  # every rail up
    try:
        _abort(rank, comm, store, kind)
    except R2CCError as exc:
        print(f"rank {rank} raised {type(exc).__name__}", flush=True)
        _monitor_saw_it(comm)
        if how == "close":
            comm.close()
        elif how == "busy":
            threading.Thread(target=_keep_calling, args=(comm,), daemon=True).start()
            time.sleep(0.2)
        sys.exit(3)
    print(f"rank {rank} raised nothing", flush=True)
    sys.exit(1)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
