"""`Communicator`: torch CPU tensors in and out, the C++ transport underneath.

Set-up goes through a torch.distributed Store (normally on the management
network, see rendezvous.py): rank 0 publishes a fresh group secret, every rank publishes the
port it listens on for each rail, then every pair of ranks connects once per rail. A rank
that fails to form the group says so there, and the others raise PeerGaveUpError at once.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import threading
import time
import weakref

import torch

from r2cc_serve import envs
from r2cc_serve.comm.errors import translate_errors
from r2cc_serve.errors import PeerGaveUpError, UserError
from r2cc_serve.comm.rail_names import resolve_rail_kinds, transport_names
from r2cc_serve.comm.rendezvous import Rendezvous

try:
    from r2cc_serve import _C
except ImportError as exc:  # pragma: no cover - only when the package was not built
    raise ImportError(
        "r2cc_serve._C (the C++ core) is not built; run `pip install -e .` in the project root"
    ) from exc

# These need the C++ core too: imported once the message above has had its chance.
from r2cc_serve.comm.durations import DurationHistogram  # noqa: E402
from r2cc_serve.comm.operations import RailOperations  # noqa: E402
from r2cc_serve.comm.options import BuiltinTuning, transport_options  # noqa: E402
from r2cc_serve.comm.tensors import check_out, contiguous, dtype_of, op_of  # noqa: E402

log = logging.getLogger(__name__)

# Communicators formed and not yet closed: interpreter exit closes them, while every thread still
# runs (atexit). Left open, none was closed at all: the rail monitor's daemon thread holds its
# communicator, so it was never freed; the monitor was still inside the transport as the
# interpreter finalized (its return there ended the process by std::terminate, csrc/bindings.cc);
# and the peers saw the connections reset, not a goodbye.
_open: "weakref.WeakSet[Communicator]" = weakref.WeakSet()
# A forked child has none of their threads and shares their sockets: it must not close them.
os.register_at_fork(after_in_child=_open.clear)


@atexit.register
def _close_at_exit() -> None:
    for comm in list(_open):
        try:
            comm.close()
        except Exception as exc:  # one that fails must not keep the others open
            log.warning("r2cc: closing group %r at exit failed: %s", comm.group, exc)


class Communicator(RailOperations):
    """A group of ranks joined by several rails (one TCP connection per rail per pair).

    rank, world_size: this rank and the group size.
    store: a torch.distributed Store every rank can reach (TCPStore, FileStore...).
    rails: this rank's rails, as interface names (``rail0``) or IPv4 addresses.
    netns: network namespace that holds those rails (lab host), or None.
    group: name that keeps several groups on one store apart.
    fallback_rails: rails that carry data only when every primary rail to a peer is down
        (e.g. the management network): serving goes on, slower, instead of failing.
    options: overrides of TransportOptions fields (else the R2CC_* knobs).

    Tensors in, tensors out: the rail monitor and control agent are control/'s, attached by the
    caller (control.attach; r2cc_serve.Communicator attaches them when R2CC_CONTROL is on).
    """

    def __init__(self, rank: int, world_size: int, store, rails: list[str], netns: str | None = None,
                 group: str = "default", fallback_rails: list[str] | None = None, **options):
        if world_size < 1 or not 0 <= rank < world_size:
            raise UserError(f"rank {rank} is outside world size {world_size}")
        if not rails:
            raise UserError("at least one rail is needed (interface names or IPv4 addresses)")
        self.rank, self.world_size, self.group = rank, world_size, group
        self.netns = netns
        self.attached = None  # control/'s monitor and agent (control.attach); close() stops them first
        self.num_fallback = len(fallback_rails or [])
        self.rail_names = list(rails) + list(fallback_rails or [])
        meet = Rendezvous(store, group, rank, world_size)
        try:
            self._form(meet, options)
        except PeerGaveUpError:
            raise
        except BaseException as exc:
            meet.give_up(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            raise
        _open.add(self)

    def _form(self, meet: Rendezvous, options: dict) -> None:
        """Everything that can fail before the group is up: this rank's rails and schedule, then
        meeting the other ranks through the store and connecting every rail to each."""
        rank, world_size, group, netns = self.rank, self.world_size, self.group, self.netns
        resolved = resolve_rail_kinds(self.rail_names, netns)
        self.rail_ips = [ip for ip, _ in resolved]
        self.rail_kinds = [kind for _, kind in resolved]  # "tcp" or "rdma" (verbs)
        self._lock = threading.Lock()
        self._durations = DurationHistogram()
        self._tuning = BuiltinTuning.from_knobs(world_size)
        self._sched = None  # GroupSchedule when all_reduce runs plans (R2CC_SCHEDULE != builtin)
        self._rail_Bps = envs.get("R2CC_RAIL_BPS")
        self._schedules = {}  # (schedule, table, allow_partial_sums) -> GroupSchedule
        self.set_schedule(envs.get("R2CC_SCHEDULE"), envs.get("R2CC_BANDWIDTH_TABLE"))
        secret = meet.secret()
        group_hash = int.from_bytes(hashlib.sha256(group.encode()).digest()[:8], "little")
        netns_path = f"/var/run/netns/{netns}" if netns else ""
        opt = transport_options(fallback_rails=self.num_fallback, **options)
        self.port_range = tuple(opt.port_range)  # the control agent listens in it too
        with translate_errors():
            self._t = _C.Transport(rank, world_size, transport_names(resolved), netns_path, secret, group_hash,
                                     opt)
        try:
            meet.publish(list(zip(self.rail_ips, self._t.listen_ports())))
            addrs = meet.peers(len(self.rail_ips))
            with translate_errors():
                self._t.connect_all(addrs)
        except BaseException:
            self._t.close()
            raise

    # ---- collectives ------------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", inplace: bool = True) -> torch.Tensor:
        """Sum (or max/min) over ranks, in canonical rank order: bit-identical on every run."""
        src = contiguous(tensor)
        out = src if inplace else torch.empty_like(src)
        if self._sched is None:
            self._run("all_reduce", src.data_ptr(), out.data_ptr(), src.numel(), dtype_of(src), op_of(op),
                      self._tuning.slice_bytes, self._tuning.one_shot_bytes)
        else:
            self._run_planned(src, out, dtype_of(src), op_of(op))
        if inplace and src is not tensor:
            tensor.copy_(src)
            return tensor
        return out

    def all_gather(self, tensor: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Concatenation of every rank's tensor along a new leading dimension of size world_size."""
        src = contiguous(tensor)
        if out is None:
            out = torch.empty((self.world_size, *src.shape), dtype=src.dtype)
        check_out(out, src.numel() * self.world_size, src.dtype)
        self._run("all_gather", src.data_ptr(), out.data_ptr(), src.numel(), dtype_of(src))
        return out

    def reduce_scatter(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """tensor's first dimension is split into world_size blocks; rank r gets the reduced block r."""
        src = contiguous(tensor)
        if src.dim() == 0 or src.shape[0] % self.world_size:
            raise UserError(f"reduce_scatter needs dim 0 divisible by world size {self.world_size}, "
                            f"got shape {tuple(src.shape)}")
        out = torch.empty((src.shape[0] // self.world_size, *src.shape[1:]), dtype=src.dtype)
        self._run("reduce_scatter", src.data_ptr(), out.data_ptr(), out.numel(), dtype_of(src), op_of(op))
        return out

    def gather(self, tensor: torch.Tensor, dst: int = 0) -> torch.Tensor | None:
        """On rank dst: [world_size, *shape] of every rank's tensor; None elsewhere."""
        src = contiguous(tensor)
        out = torch.empty((self.world_size, *src.shape), dtype=src.dtype) if self.rank == dst else None
        self._run("gather", src.data_ptr(), out.data_ptr() if out is not None else 0, src.numel(), dtype_of(src),
                  self._check_rank(dst))
        return out

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """In place: every rank's tensor becomes rank src's."""
        buf = contiguous(tensor)
        self._run("broadcast", buf.data_ptr(), buf.numel() * buf.element_size(), self._check_rank(src))
        if buf is not tensor:
            tensor.copy_(buf)
        return tensor

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        buf = contiguous(tensor)
        self._run("send", buf.data_ptr(), buf.numel() * buf.element_size(), self._check_peer(dst))

    def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        buf = contiguous(tensor)
        self._run("recv", buf.data_ptr(), buf.numel() * buf.element_size(), self._check_peer(src))
        if buf is not tensor:
            tensor.copy_(buf)
        return tensor

    # ---- schedules ------------------------------------------------------------------

    def set_schedule(self, schedule: str, table: str = "", allow_partial_sums: bool = False) -> None:
        """How all_reduce runs from the next call on: 'builtin' (the fixed C++ path), 'auto' (the
        planner), or a forced plan ('direct', 'one_shot', 'optcc'; 'ring'/'r2ccl' beyond 16 ranks,
        or with allow_partial_sums for benchmarks). ``table``: fixed per-rank bandwidth ('1,1,1,0.5'),
        else auto/optcc exchange each rank's healthy rails in-band. Every rank must make the same
        call between the same collectives (like a collective, without traffic)."""
        from r2cc_serve.sched.group import GroupSchedule, runs_builtin

        key = (schedule, table, allow_partial_sums)
        sched = self._schedules.get(key)  # switching back keeps the compiled plans
        if sched is None and not runs_builtin(schedule, self.world_size, table):
            sched = self._schedules[key] = GroupSchedule.from_knobs(
                self.rank, self.world_size, schedule, _C.PlanProgram, table, allow_partial_sums=allow_partial_sums,
                full_Bps=self._rail_Bps * (self.num_rails - self.num_fallback),
                slice_bytes=self._tuning.slice_bytes, one_shot_bytes=self._tuning.one_shot_bytes)
        with self._lock:
            self._sched, self._schedule = sched, schedule

    def plan_info(self) -> dict:
        """The schedule in use, the agreed per-rank bandwidth, the planner's epoch and choices.
        Never waits for a running collective (the monitor calls it): the planner has its own lock."""
        sched = self._sched
        return {"schedule": self._schedule} if sched is None else sched.describe()

    def plan_ran(self, count: int, elem_bytes: int = 4) -> dict | None:
        """sched/'s report of what the last all_reduce of this shape ran (sched.group.plan_report;
        None when none ran on this table). Schedule builtin: what the built-in path runs for it."""
        from r2cc_serve.sched.group import builtin_report

        sched = self._sched
        if sched is None:
            return builtin_report(count, elem_bytes, self._tuning.one_shot_bytes, self._tuning.slice_bytes)
        return sched.ran(count, elem_bytes)

    def _run_planned(self, src: torch.Tensor, out: torch.Tensor, dtype, op) -> None:
        with self._lock, translate_errors():
            start = time.perf_counter()
            with self._sched.all_reduce(src.numel(), src.element_size(), self._gather_ints, self._capacity) as program:
                if program is None:  # what the C++ path runs anyway: the same bits, without the executor's bookkeeping
                    self._t.all_reduce(src.data_ptr(), out.data_ptr(), src.numel(), dtype, op,
                                       self._tuning.slice_bytes, self._tuning.one_shot_bytes)
                else:
                    self._t.all_reduce_plan(program, src.data_ptr(), out.data_ptr(), src.numel(), dtype, op)
            self._durations.observe(time.perf_counter() - start)

    def _capacity(self) -> int:
        """This rank's bytes/s for the planner: healthy primary rails x R2CC_RAIL_BPS."""
        from r2cc_serve.sched.group import capacity_from_rails

        states = [(s.rail, s.state) for s in self._t.stats()]
        return capacity_from_rails(states, self.num_rails - self.num_fallback, self._rail_Bps)

    def _gather_ints(self, mine: list[int]) -> list[list[int]]:
        """Every rank's list of int64 (same length everywhere), in rank order: one all_gather."""
        n = len(mine)
        mine_t = torch.tensor(mine, dtype=torch.int64)  # held here: the C++ call reads its memory
        every = torch.empty(self.world_size * n, dtype=torch.int64)
        self._t.all_gather(mine_t.data_ptr(), every.data_ptr(), n, _C.DType.i64)
        return every.view(self.world_size, n).tolist()

    # ---- what control/ attached, and closing ------------------------------------------

    @property
    def monitor(self):
        """The attached rail monitor (health.monitor.RailMonitor), or None."""
        return getattr(self.attached, "monitor", None)

    @property
    def agent(self):
        """The attached control agent (control.agent.ControlAgent), or None."""
        return getattr(self.attached, "agent", None)

    def close(self) -> None:
        """Stops what control/ attached, then the transport (goodbyes to the peers). Idempotent;
        done at interpreter exit for a communicator still open."""
        _open.discard(self)
        attached, self.attached = getattr(self, "attached", None), None
        if attached is not None:
            attached.stop()
        t = getattr(self, "_t", None)
        if t is not None:
            t.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- helpers --------------------------------------------------------------------

    def _run(self, name: str, *args) -> None:
        with self._lock, translate_errors():
            start = time.perf_counter()
            getattr(self._t, name)(*args)
            self._durations.observe(time.perf_counter() - start)

    def duration_histogram(self) -> dict:
        """Cumulative histogram of collective durations (seconds), Prometheus-style buckets."""
        return self._durations.snapshot()
