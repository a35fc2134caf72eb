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
from dataclasses import dataclass

import torch

from r2cc_serve import envs
from r2cc_serve.comm.errors import translate_errors
from r2cc_serve.errors import PeerGaveUpError, UserError
from r2cc_serve.comm.rail_names import resolve_rails
from r2cc_serve.comm.rendezvous import Rendezvous

try:
    from r2cc_serve import _C
except ImportError as exc:  # pragma: no cover - only when the package was not built
    raise ImportError(
        "r2cc_serve._C (the C++ core) is not built; run `pip install -e .` in the project root"
    ) from exc

_DTYPES = {
    torch.float32: _C.DType.f32,
    torch.float16: _C.DType.f16,
    torch.bfloat16: _C.DType.bf16,
    torch.int32: _C.DType.i32,
    torch.int64: _C.DType.i64,
}
_OPS = {"sum": _C.RedOp.sum, "max": _C.RedOp.max, "min": _C.RedOp.min}

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


def transport_options(**overrides) -> "_C.TransportOptions":
    """TransportOptions from the R2CC_* knobs, with explicit overrides on top."""
    opt = _C.TransportOptions()
    for knob in envs.transport_knobs():  # the registry says which knob sets which field
        setattr(opt, knob.transport, envs.get(knob.name))
    for key, value in overrides.items():
        if not hasattr(opt, key):
            raise UserError(f"unknown transport option {key!r}")
        setattr(opt, key, value)
    return opt


class DurationHistogram:
    """Counts of collective durations per upper bound (seconds); cheap enough for the hot path."""

    BOUNDS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

    def __init__(self):
        self.counts = [0] * (len(self.BOUNDS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        i = 0
        while i < len(self.BOUNDS) and seconds > self.BOUNDS[i]:
            i += 1
        self.counts[i] += 1
        self.total += seconds

    def snapshot(self) -> dict:
        return {"bounds": list(self.BOUNDS), "counts": list(self.counts), "sum": self.total}


@dataclass
class BuiltinTuning:
    """How the built-in C++ all_reduce cuts its work (equal on every rank)."""

    slice_bytes: int     # R2CC_PIPELINE_BYTES: reduction of one slice overlaps the next's transfer
    one_shot_bytes: int  # up to this, one exchange of whole inputs (sched.group.one_shot_cutoff)


class Communicator:
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
        self.rail_ips = resolve_rails(self.rail_names, netns)
        self._lock = threading.Lock()
        self._durations = DurationHistogram()
        from r2cc_serve.sched.group import one_shot_cutoff

        one_shot = one_shot_cutoff(world_size, envs.get("R2CC_ALLREDUCE_ONE_SHOT_BYTES"),
                                   envs.get("R2CC_PAIR_ONE_SHOT_BYTES"))
        self._tuning = BuiltinTuning(slice_bytes=envs.get("R2CC_PIPELINE_BYTES"), one_shot_bytes=one_shot)
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
            self._t = _C.Transport(rank, world_size, self.rail_ips, netns_path, secret, group_hash, opt)
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
        src = _contiguous(tensor)
        out = src if inplace else torch.empty_like(src)
        if self._sched is None:
            self._run("all_reduce", src.data_ptr(), out.data_ptr(), src.numel(), _dtype(src), _op(op),
                      self._tuning.slice_bytes, self._tuning.one_shot_bytes)
        else:
            self._run_planned(src, out, _dtype(src), _op(op))
        if inplace and src is not tensor:
            tensor.copy_(src)
            return tensor
        return out

    def all_gather(self, tensor: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Concatenation of every rank's tensor along a new leading dimension of size world_size."""
        src = _contiguous(tensor)
        if out is None:
            out = torch.empty((self.world_size, *src.shape), dtype=src.dtype)
        _check_out(out, src.numel() * self.world_size, src.dtype)
        self._run("all_gather", src.data_ptr(), out.data_ptr(), src.numel(), _dtype(src))
        return out

    def reduce_scatter(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """tensor's first dimension is split into world_size blocks; rank r gets the reduced block r."""
        src = _contiguous(tensor)
        if src.dim() == 0 or src.shape[0] % self.world_size:
            raise UserError(f"reduce_scatter needs dim 0 divisible by world size {self.world_size}, "
                            f"got shape {tuple(src.shape)}")
        out = torch.empty((src.shape[0] // self.world_size, *src.shape[1:]), dtype=src.dtype)
        self._run("reduce_scatter", src.data_ptr(), out.data_ptr(), out.numel(), _dtype(src), _op(op))
        return out

    def gather(self, tensor: torch.Tensor, dst: int = 0) -> torch.Tensor | None:
        """On rank dst: [world_size, *shape] of every rank's tensor; None elsewhere."""
        src = _contiguous(tensor)
        out = torch.empty((self.world_size, *src.shape), dtype=src.dtype) if self.rank == dst else None
        self._run("gather", src.data_ptr(), out.data_ptr() if out is not None else 0, src.numel(), _dtype(src),
                  self._check_rank(dst))
        return out

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """In place: every rank's tensor becomes rank src's."""
        buf = _contiguous(tensor)
        self._run("broadcast", buf.data_ptr(), buf.numel() * buf.element_size(), self._check_rank(src))
        if buf is not tensor:
            tensor.copy_(buf)
        return tensor

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        buf = _contiguous(tensor)
        self._run("send", buf.data_ptr(), buf.numel() * buf.element_size(), self._check_peer(dst))

    def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        buf = _contiguous(tensor)
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
        from r2cc_serve.sched.cost import CostModel
        from r2cc_serve.sched.group import GroupSchedule

        key = (schedule, table, allow_partial_sums)
        sched = self._schedules.get(key)  # switching back keeps the compiled plans
        # Two ranks: no schedule beats the built-in one (the bound equals it), so auto keeps it
        # and spends nothing on planning or exchanges.
        builtin = schedule == "builtin" or (schedule == "auto" and self.world_size <= 2 and not table)
        if sched is None and not builtin:
            sched = GroupSchedule(self.rank, self.world_size, schedule, _C.PlanProgram, table,
                                  full_Bps=self._rail_Bps * (self.num_rails - self.num_fallback),
                                  refresh_calls=envs.get("R2CC_PLAN_REFRESH_CALLS"),
                                  refresh_bytes=envs.get("R2CC_PLAN_REFRESH_BYTES"),
                                  slice_bytes=self._tuning.slice_bytes, allow_partial_sums=allow_partial_sums,
                                  model=CostModel(alpha_s=envs.get("R2CC_PLAN_ALPHA_S"),
                                                  overhead_s=envs.get("R2CC_PLAN_MSG_OVERHEAD_S")),
                                  trial_calls=envs.get("R2CC_PLAN_TRIAL_CALLS"),
                                  one_shot_bytes=self._tuning.one_shot_bytes)
            self._schedules[key] = sched
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

    # ---- operator actions and health -----------------------------------------------

    @property
    def num_rails(self) -> int:
        return len(self.rail_ips)

    @property
    def monitor(self):
        """The attached rail monitor (health.monitor.RailMonitor), or None."""
        return getattr(self.attached, "monitor", None)

    @property
    def agent(self):
        """The attached control agent (control.agent.ControlAgent), or None."""
        return getattr(self.attached, "agent", None)

    def drain_rail(self, rail: int, force: bool = True) -> None:
        """No new chunks on `rail` (both directions, all peers); in-flight ones finish.
        force=False: raise LastRailError (changing nothing) when it is some peer's last healthy rail;
        the check and the action are one step, whatever else runs at the same time."""
        with translate_errors():
            self._t.drain_rail(self._check_rail(rail), force)

    def undrain_rail(self, rail: int) -> None:
        self._t.undrain_rail(self._check_rail(rail))

    def failover_rail(self, rail: int, force: bool = True) -> None:
        """Treat `rail` as failed now: its in-flight chunks move to the other rails; kept out until restore_rail.
        force=False: as for drain_rail."""
        with translate_errors():
            self._t.failover_rail(self._check_rail(rail), force)

    def restore_rail(self, rail: int) -> None:
        self._t.restore_rail(self._check_rail(rail))

    def inject_failure(self, peer: int, rail: int, after_chunks: int = 1) -> None:
        """Test fault injector: the connection to `peer` on `rail` fails right after `after_chunks`
        more data chunks were written on it, by its writer thread or by a calling thread (so
        un-acknowledged data is surely in flight)."""
        self._t.inject_failure(self._check_peer(peer), self._check_rail(rail), after_chunks)

    def inject_full_socket(self, peer: int, rail: int) -> None:
        """Test fault injector: the next chunk this rank's calling thread writes itself may go on
        `rail` to `peer` without checking the socket has room for all of it. A chunk larger
        than the socket takes (R2CC_CHUNK_BYTES) then fills it part-way, and the rail's writer
        thread must finish it."""
        self._t.inject_full_socket(self._check_peer(peer), self._check_rail(rail))

    def abort(self, reason: str) -> None:
        self._t.abort(reason)

    def rail_stats(self) -> list[dict]:
        """One dict per (peer, rail) connection of this rank: the core's fields (_C.ConnStats.FIELDS,
        csrc/stats.h), then the rail's address and interface."""
        out = []
        for s in self._t.stats():
            out.append(s.as_dict())
            out[-1]["address"] = self.rail_ips[s.rail]
            out[-1]["interface"] = self.rail_names[s.rail]
        return out

    def peer_stats(self) -> list[dict]:
        """One dict per peer: whether it is stalled (its process silent while its host still
        acknowledges: nothing is failed over for that), for how long, whether a path exists, and whether
        it closed its communicator (an orderly goodbye: its rails went down without a fault), and the
        chunk size its next bulk message gets (sized to its slowest rail, R2CC_CHUNK_BYTES)."""
        return [s.as_dict() for s in self._t.peer_stats()]

    def error_kind(self) -> str:
        """Kind of the group's error ("" while healthy): rails_down, peer_stalled, peer_gone,
        call_mismatch, timeout, closed or aborted."""
        kind = self._t.error_kind()
        return "" if kind == "none" else kind

    def counters(self) -> dict:
        """The transport's totals (_C.Counters.FIELDS): failovers, re-sent chunks, spins, hedges..."""
        return self._t.counters().as_dict()

    def error(self) -> str:
        return self._t.error()

    def state_signature(self) -> str:
        """Text that changes whenever the group's error, a peer's stall or goodbye, or a rail's shown
        state, hold reason or last error does; cheap, for the monitor's check between full samples."""
        return self._t.state_signature()

    def wait_state_change(self, seen: str, poll_s: float, timeout_s: float, watch_path: str = "",
                          watch_since_ns: int = 0) -> str:
        """Block (without the GIL) until state_signature() differs from `seen`, the file watch_path
        was modified at or after watch_since_ns, interrupt_state_wait() is called or timeout_s
        passes; the signature then. The transport's watchdog passes look every poll_s and wake
        this thread only when it has something to return."""
        return self._t.wait_state_change(seen, max(1, round(poll_s * 1000)), max(0, round(timeout_s * 1000)),
                                         watch_path, int(watch_since_ns))

    def interrupt_state_wait(self) -> None:
        self._t.interrupt_state_wait()

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

    def _check_rank(self, r: int) -> int:
        if not 0 <= r < self.world_size:
            raise UserError(f"rank {r} is outside the group of {self.world_size}")
        return r

    def _check_peer(self, r: int) -> int:
        if self._check_rank(r) == self.rank:
            raise UserError(f"rank {r} cannot send to or receive from itself")
        return r

    def _check_rail(self, rail: int) -> int:
        if not 0 <= rail < self.num_rails:
            raise UserError(f"no rail {rail}: this group has rails 0..{self.num_rails - 1}")
        return rail


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise UserError(f"expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise UserError(f"r2cc works on CPU tensors; got one on {t.device}")
    return t if t.is_contiguous() else t.contiguous()


def _dtype(t: torch.Tensor):
    try:
        return _DTYPES[t.dtype]
    except KeyError:
        raise UserError(f"dtype {t.dtype} is not supported; use one of "
                        f"{', '.join(str(d) for d in _DTYPES)}") from None


def _op(op: str):
    try:
        return _OPS[op]
    except KeyError:
        raise UserError(f"reduce op {op!r} is not supported; use one of {', '.join(_OPS)}") from None


def _check_out(out: torch.Tensor, numel: int, dtype) -> None:
    if out.numel() != numel or out.dtype != dtype or not out.is_contiguous():
        raise UserError(f"out must be a contiguous {dtype} tensor of {numel} elements")
