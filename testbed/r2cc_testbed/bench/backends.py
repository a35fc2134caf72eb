"""The backends a worker can drive (r2cc, gloo in its three wirings, Open MPI, and a bare-TCP floor),
behind one small interface.

    b = make_backend("gloo", rank, world, store, rails, timeout_s)
    runner = b.runner("all_reduce", inp)   # buffers allocated once, outside any timing
    runner.reset(); b.barrier(); out = runner.run()

All ops are in place on a work buffer (or into a preallocated output), so no backend pays for
page faults on a fresh output inside the timed region. Imports are lazy: an MPI worker must
not need r2cc's C++ core, and an r2cc worker must not load libmpi.
"""

from __future__ import annotations

import datetime
import os
from typing import Callable

import torch

from r2cc_testbed.bench.data import ROOT
from r2cc_testbed.bench.spec import WAIT_COUNTS


class Runner:
    """One op bound to its buffers. reset() restores the input (untimed); run() does the op."""

    def __init__(self, reset: Callable[[], None], run: Callable[[], torch.Tensor]):
        self.reset, self.run = reset, run


def _inplace(inp: torch.Tensor, op_fn: Callable[[torch.Tensor], object]) -> Runner:
    work = inp.clone()

    def run() -> torch.Tensor:
        op_fn(work)
        return work
    return Runner(lambda: work.copy_(inp), run)


def _outplace(out: torch.Tensor, op_fn: Callable[[], object]) -> Runner:
    def run() -> torch.Tensor:
        result = op_fn()
        return out if result is None else result
    return Runner(lambda: None, run)


class R2ccBackend:
    name = "r2cc"

    def __init__(self, rank, world, store, rails, timeout_s, group="bench"):
        from r2cc_serve import Communicator
        self.world = world
        self.comm = Communicator(rank, world, store, rails=rails, netns=None, group=group,
                                 op_timeout_s=float(timeout_s))
        self._one = torch.zeros(1)

    def barrier(self) -> None:
        self.comm.all_reduce(self._one)

    def set_schedule(self, schedule: str | None) -> None:
        """all_reduce schedule from now on (every rank at the same point); None: R2CC_SCHEDULE.
        A benchmark may force ring in a small group: its result is checked with a tolerance."""
        from r2cc_serve import envs
        self.comm.set_schedule(schedule or envs.get("R2CC_SCHEDULE"), allow_partial_sums=True)

    def plan_info(self) -> dict:
        return self.comm.plan_info()

    def plan_ran(self, inp: torch.Tensor) -> dict | None:
        """sched/'s report of what the last all_reduce of inp's shape ran (the simulator rebuilds it)."""
        return self.comm.plan_ran(inp.numel(), inp.element_size())

    def drain(self, rail: int) -> None:
        """Take this rank's rail out of service (held for the launch: --hold-fault hH:R:drain)."""
        self.comm.drain_rail(rail, force=True)

    def rail_states(self) -> list[tuple[int, int, str]]:
        return sorted((s["peer"], s["rail"], s["state"]) for s in self.comm.rail_stats())

    def runner(self, op: str, inp: torch.Tensor) -> Runner:
        c = self.comm
        if op == "all_reduce":
            return _inplace(inp, c.all_reduce)
        if op == "broadcast":
            return _inplace(inp, lambda w: c.broadcast(w, ROOT))
        if op == "all_gather":
            out = torch.empty(inp.numel() * self.world)
            return _outplace(out, lambda: c.all_gather(inp, out=out.view(self.world, -1)))
        if op == "reduce_scatter":
            return _outplace(None, lambda: c.reduce_scatter(inp))
        raise ValueError(op)

    def resent_bytes(self) -> int:
        return int(self.comm.counters()["bytes_resent"])

    def repairs(self) -> tuple[int, int]:
        """(bytes re-sent, failovers) so far, from one read of the counters."""
        c = self.comm.counters()
        return int(c["bytes_resent"]), int(c["failovers"])

    def wait_counts(self) -> dict[str, int]:
        """How the transport's waits and writes went so far (WAIT_COUNTS): waits that spun and got
        their bytes, spun for nothing, or slept at once (CPU pressure); chunks a rail's writer
        thread wrote (a wake-up) instead of the caller; inline writes that filled the socket;
        second copies of small messages late to be acknowledged."""
        c = self.comm.counters()
        return {k: int(c[k]) for k in WAIT_COUNTS}

    def chunks(self) -> tuple[int, int]:
        """(bytes, chunks) sent so far on every rail: how large the transport cut its messages."""
        s = self.comm.rail_stats()
        return sum(x["bytes_sent"] for x in s), sum(x["chunks_sent"] for x in s)

    def rail_errors(self) -> list[str]:
        return sorted({f"rail{s['rail']}: {s['last_error']} (detected after {s['last_detect_s'] * 1e3:.0f} ms)"
                       for s in self.comm.rail_stats() if s["last_error"]})

    def detection(self, rail: int) -> dict:
        """How the failure of `rail` was seen: slowest detection over the connections that failed
        since the last call (the worker calls it before and after a fault; a connection that did
        not fail this time keeps an older failure's figure, which must not count), first error."""
        conns = [s for s in self.comm.rail_stats() if s["rail"] == rail]
        seen = getattr(self, "_failovers_seen", {})
        failed = [s for s in conns if s["failovers"] > seen.get((s["peer"], s["rail"]), 0)]
        self._failovers_seen = {**seen, **{(s["peer"], s["rail"]): s["failovers"] for s in conns}}
        return {"detect_s": max((s["last_detect_s"] for s in failed), default=None),
                "rail_error": next((s["last_error"] for s in conns if s["last_error"]), None),
                "failovers": sum(s["failovers"] for s in conns),
                "states": [s["state"] for s in conns]}

    def close(self) -> None:
        self.comm.close()


class _PeerBackend:
    """A peer library: it has no view of rails, re-sends or failovers of its own."""

    def resent_bytes(self) -> int:
        return 0

    def repairs(self) -> tuple[int, int]:
        return 0, 0

    def wait_counts(self) -> dict[str, int]:
        return {}

    def chunks(self) -> tuple[int, int]:
        return 0, 0

    def rail_errors(self) -> list[str]:
        return []

    def rail_states(self) -> list:
        return []  # no rails of its own to report: always "as before"


class GlooBackend(_PeerBackend):
    """torch.distributed gloo. The parent puts it on the rails (lab/baselines.py): gloo one rail,
    gloo-rails a device per rail, gloo-mptcp one rail under MPTCP with a subflow per rail."""
    name = "gloo"

    def __init__(self, rank, world, store, rails, timeout_s, name="gloo"):
        import torch.distributed as dist
        self.name = name
        self.dist, self.world = dist, world
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        self._one = torch.zeros(1)

    def barrier(self) -> None:
        self.dist.all_reduce(self._one)

    def runner(self, op: str, inp: torch.Tensor) -> Runner:
        d = self.dist
        if op == "all_reduce":
            return _inplace(inp, d.all_reduce)
        if op == "broadcast":
            return _inplace(inp, lambda w: d.broadcast(w, ROOT))
        if op == "all_gather":
            out = torch.empty(inp.numel() * self.world)
            return _outplace(out, lambda: d.all_gather_into_tensor(out, inp))
        if op == "reduce_scatter":
            out = torch.empty(inp.numel() // self.world)
            return _outplace(out, lambda: d.reduce_scatter_tensor(out, inp))
        raise ValueError(op)

    def close(self) -> None:
        pass  # destroy_process_group can block on a broken group; the process exits instead


class MpiBackend(_PeerBackend):
    """Open MPI through mpi4py on numpy views of the torch buffers (no copies)."""
    name = "mpi"

    def __init__(self, rank, world, store, rails, timeout_s):
        from mpi4py import MPI
        self.MPI, self.comm = MPI, MPI.COMM_WORLD
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)  # an error raises instead of aborting the job
        if (self.comm.Get_rank(), self.comm.Get_size()) != (rank, world):
            raise RuntimeError(f"mpirun gave rank {self.comm.Get_rank()}/{self.comm.Get_size()}, "
                               f"expected {rank}/{world}")
        self.world = world

    def barrier(self) -> None:
        self.comm.Barrier()

    def runner(self, op: str, inp: torch.Tensor) -> Runner:
        c, MPI = self.comm, self.MPI
        src = inp.numpy()
        if op == "all_reduce":
            return _inplace(inp, lambda w: c.Allreduce(MPI.IN_PLACE, w.numpy(), op=MPI.SUM))
        if op == "broadcast":
            return _inplace(inp, lambda w: c.Bcast(w.numpy(), root=ROOT))
        if op == "all_gather":
            out = torch.empty(inp.numel() * self.world)
            return _outplace(out, lambda: c.Allgather(src, out.numpy()))
        if op == "reduce_scatter":
            out = torch.empty(inp.numel() // self.world)
            return _outplace(out, lambda: c.Reduce_scatter_block(src, out.numpy(), op=MPI.SUM))
        raise ValueError(op)

    def close(self) -> None:
        pass


class TcpFloorBackend(_PeerBackend):
    """A plain TCP ring over the same rails, all_reduce only (bench/tcp_floor.py): the floor."""
    name = "tcp-floor"

    def __init__(self, rank, world, store, rails, timeout_s):
        from r2cc_testbed.bench.tcp_floor import TcpRing
        from r2cc_serve.comm.rail_names import resolve_rails
        self.ring = TcpRing(rank, world, store, resolve_rails(rails, None), timeout_s)
        self._one = torch.zeros(world)

    def barrier(self) -> None:
        self.ring.all_reduce(self._one)

    def runner(self, op: str, inp: torch.Tensor) -> Runner:
        if op != "all_reduce":
            raise ValueError(f"tcp-floor runs all_reduce only, not {op}")
        return _inplace(inp, self.ring.all_reduce)

    def close(self) -> None:
        self.ring.close()


def make_backend(name: str, rank: int, world: int, store, rails: list[str], timeout_s: float, **kw):
    if name.startswith("gloo"):
        return GlooBackend(rank, world, store, rails, timeout_s, name=name, **kw)
    cls = {"r2cc": R2ccBackend, "mpi": MpiBackend, "tcp-floor": TcpFloorBackend}[name]
    return cls(rank, world, store, rails, timeout_s, **kw)


class RailTxCounters:
    """Bytes sent so far on each rail of this namespace (kernel counters, any backend), read
    through files opened once: opening the four sysfs files took ~0.2 ms, as long as a 4 KiB
    all_reduce, and the bench reads them between the barrier and the timed call (a rank slow
    there starts the call late and its peer's time counts the wait); a re-read takes ~6 us."""

    def __init__(self, rails: list[str]):
        self._fds = [self._open(r) for r in rails]

    @staticmethod
    def _open(rail: str) -> int | None:
        try:
            return os.open(f"/sys/class/net/{rail}/statistics/tx_bytes", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None

    def read(self) -> list[int]:
        out = []
        for fd in self._fds:
            try:
                out.append(int(os.pread(fd, 32, 0)) if fd is not None else 0)
            except (OSError, ValueError):
                out.append(0)
        return out
