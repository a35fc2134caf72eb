"""What a group needs to run plans: the same plan on every rank, and its programs cached.

Messages match by order, so every rank must build the same plan for a call: same schedule, same
shares, same chunks. Plans are a pure function of (schedule knob, op, count, dtype, bandwidth
table), so the ranks only have to agree on the table, and only for schedules that read it
(auto, optcc; a forced direct or one_shot needs nothing).

The protocol: each rank knows its own capacity (its healthy rails, ``capacity_from_rails``); the
ranks exchange these in-band, one 8-byte value per rank (an all_gather), at calls every rank
picks alike from the calls themselves (``Agreement.due``): the first planned all_reduce, then
whenever ``refresh_calls`` calls or ``refresh_bytes`` bytes have run on the current table. Identical
gathered values give identical tables, quantized tables, epochs and plans everywhere. A static
table (R2CC_BANDWIDTH_TABLE) replaces the exchange.

``GroupSchedule.all_reduce`` runs the whole protocol (exchange, choice, trial verdicts) around one
call, given a way to gather; the communicator only runs the program it is handed. What ran is
reported by ``GroupSchedule.ran`` (``builtin_report`` for the built-in path), and ``plan_of``
rebuilds it: the same function compiles the programs, so a report cannot drift from them.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import numpy as np

from r2cc_serve import envs
from r2cc_serve.errors import UserError
from r2cc_serve.sched.bandwidth import Bandwidth
from r2cc_serve.sched.cost import CostModel
from r2cc_serve.sched.ir import Plan
from r2cc_serve.sched import builders
from r2cc_serve.sched.planner import Planner, size_bucket
from r2cc_serve.sched.trials import Trials

BANDWIDTH_SCHEDULES = ("auto", "optcc", "r2ccl")  # schedules whose plan depends on the table


def one_shot_cutoff(p: int, one_shot_bytes: int, pair_one_shot_bytes: int) -> int:
    """The largest all_reduce the built-in path runs as one_shot in a group of p ranks
    (R2CC_ALLREDUCE_ONE_SHOT_BYTES, R2CC_PAIR_ONE_SHOT_BYTES). Between two ranks one_shot sends
    no more bytes than direct (each rank's whole input, once) and saves a message delay; it
    reduces the whole vector instead of half, which costs more than that delay only for large
    vectors. Beyond two ranks it also sends p/2 times the bytes, so its cut-off is far lower."""
    return pair_one_shot_bytes if p == 2 else one_shot_bytes


def builtin_schedule(nbytes: int, one_shot_bytes: int) -> str:
    """What the built-in C++ all_reduce runs for this size (R2CC_ALLREDUCE_ONE_SHOT_BYTES)."""
    return "one_shot" if nbytes <= one_shot_bytes else "direct"


def runs_builtin(schedule: str, p: int, table: str) -> bool:
    """Does this schedule run the built-in C++ path alone (no GroupSchedule)? Two ranks: no
    schedule beats the built-in one (the bound equals it), so auto keeps it and spends nothing
    on planning or exchanges."""
    return schedule == "builtin" or (schedule == "auto" and p <= 2 and not table)


def plan_report(schedule: str, count: int, elem_bytes: int, chunks: int = 1, bandwidth: Bandwidth | None = None,
                slice_bytes: int = builders.DEFAULT_SLICE_BYTES, path: str = "plan") -> dict:
    """What an all_reduce ran, as plain data (JSON): enough for ``plan_of`` to rebuild it.
    ``path``: "plan" (the executor ran this plan) or "builtin" (the built-in C++ path ran it)."""
    bw = None if bandwidth is None else {"out": bandwidth.out_Bps.tolist(), "in": bandwidth.in_Bps.tolist()}
    return {"schedule": schedule, "count": count, "elem_bytes": elem_bytes, "chunks": chunks,
            "bandwidth_Bps": bw, "slice_bytes": slice_bytes, "path": path}


def plan_of(report: dict, p: int) -> Plan:
    """The plan a ``plan_report`` describes. The executor's programs are compiled from it too, so a
    report rebuilds exactly what ran (r2cc bench simulates it)."""
    bw = report["bandwidth_Bps"]
    return builders.build(report["schedule"], p, report["count"], bw=bw and Bandwidth(bw["out"], bw["in"]),
                          elem_bytes=report["elem_bytes"], chunks=report["chunks"], slice_bytes=report["slice_bytes"])


def builtin_report(count: int, elem_bytes: int, one_shot_bytes: int, slice_bytes: int) -> dict:
    """What the built-in C++ all_reduce runs for this call (schedule builtin: no GroupSchedule)."""
    return plan_report(builtin_schedule(count * elem_bytes, one_shot_bytes), count, elem_bytes,
                       slice_bytes=slice_bytes, path="builtin")


def parse_table(text: str, p: int, full_Bps: float = 1.0) -> Bandwidth | None:
    """'1,1,1,0.5' (one per rank) -> a table; '' -> None. Values up to 1 are fractions of
    ``full_Bps`` (a rank with every rail up), larger ones bytes/s."""
    if not text.strip():
        return None
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise UserError(f"bandwidth table {text!r}: use comma-separated numbers, one per rank") from None
    if len(values) != p:
        raise UserError(f"bandwidth table {text!r} has {len(values)} values for a group of {p} ranks")
    v = np.array(values)
    if v.size and v.max() <= 1.0:
        v = v * full_Bps
    return Bandwidth(v, v)


def capacity_from_rails(states: Sequence[tuple[int, str]], primary_rails: int, rail_Bps: float) -> int:
    """This rank's capacity in bytes/s: ``rail_Bps`` per primary rail that is up to some peer.

    ``states``: (rail, state) of every connection of this rank. A rail down to every peer (a dead
    NIC or cable) is lost; one up to some peers still carries full rate to them. Never 0 (a rank
    without primary rails runs on a fallback rail or fails; the table must stay positive).
    """
    up = {rail for rail, state in states if rail < primary_rails and state == "up"}
    return int(max(len(up), 0.1) * rail_Bps)


class Agreement:
    """When to exchange, and the table from what was exchanged. One per communicator; every rank
    makes the same calls, so every rank's ``due`` answers alike."""

    def __init__(self, p: int, refresh_calls: int, refresh_bytes: int) -> None:
        if refresh_calls < 1 or refresh_bytes < 0:
            raise UserError("R2CC_PLAN_REFRESH_CALLS must be >= 1 and R2CC_PLAN_REFRESH_BYTES >= 0")
        self.p, self.refresh_calls, self.refresh_bytes = p, refresh_calls, refresh_bytes
        self._calls = self._bytes = 0  # since the last exchange
        self.exchanges = 0

    def due(self, nbytes: int) -> bool:
        """Counts one planned call; True when the ranks must exchange their capacities first:
        at the first call, once ``refresh_calls`` calls or ``refresh_bytes`` bytes have run on
        the current table, and before any call of ``refresh_bytes`` or more. So the exchange
        costs one small all_gather per that many bytes moved, and a rail failure re-plans
        within one refresh however large the calls are."""
        if (not self._calls or self._calls >= self.refresh_calls or self._bytes >= self.refresh_bytes
                or nbytes >= self.refresh_bytes):
            self._calls, self._bytes = 1, nbytes
            return True
        self._calls += 1
        self._bytes += nbytes
        return False

    def table(self, capacities: Sequence[int]) -> Bandwidth:
        """The table every rank builds from the gathered capacities (bytes/s, rank order)."""
        if len(capacities) != self.p:
            raise UserError(f"gathered {len(capacities)} capacities for a group of {self.p}")
        self.exchanges += 1
        c = np.asarray(capacities, dtype=np.float64)
        return Bandwidth(c, c)


class GroupSchedule:
    """One communicator's planned all_reduce: planner, agreement and compiled programs.

    ``compile(program_bytes)`` turns this rank's ``Program.encode()`` into what the executor runs
    (``_C.PlanProgram``); it is called once per plan. Not thread-safe: the communicator calls
    ``all_reduce`` under its lock, and every rank must make the same calls (see the module
    docstring). The other methods are that protocol's steps, public for tests.
    """

    def __init__(self, rank: int, p: int, schedule: str, compile: Callable[[bytes], object], table: str = "",
                 full_Bps: float = 1.25e9, refresh_calls: int = 256, refresh_bytes: int = 16 << 20,
                 slice_bytes: int | None = None, allow_partial_sums: bool = False, max_programs: int = 64,
                 model: CostModel = CostModel(), trial_calls: int = 6, one_shot_bytes: int = 32 << 10) -> None:
        """``full_Bps``: a rank's capacity with every rail up (the table until one is agreed).
        ``trial_calls``: auto only, calls per size bucket that check the model (sched.trials);
        ``one_shot_bytes``: where the baseline (the built-in path's choice) is one_shot."""
        self.rank, self.schedule, self._compile = rank, schedule, compile
        self.p, self.one_shot_bytes = p, one_shot_bytes
        self.slice_bytes = builders.DEFAULT_SLICE_BYTES if slice_bytes is None else slice_bytes
        self.planner = Planner(p, model=model, force=None if schedule == "auto" else schedule,
                               allow_partial_sums=allow_partial_sums, slice_bytes=self.slice_bytes)
        self.trials = Trials(trial_calls) if schedule == "auto" else None
        static = parse_table(table, p, full_Bps)
        self.planner.update_bandwidth(static if static is not None else Bandwidth.uniform(p, full_Bps))
        self.agreement = None
        if static is None and schedule in BANDWIDTH_SCHEDULES:
            self.agreement = Agreement(p, refresh_calls, refresh_bytes)
        self._programs: OrderedDict[tuple, object] = OrderedDict()  # oldest compiled first
        self._ran: OrderedDict[tuple, tuple] = OrderedDict()  # (count, elem_bytes) -> what ran, oldest first
        self._max = max_programs

    @classmethod
    def from_knobs(cls, rank: int, p: int, schedule: str, compile: Callable[[bytes], object], table: str = "",
                   **kw) -> "GroupSchedule":
        """One with the R2CC_PLAN_* knobs' refresh, cost model and trials (``kw``: the rest)."""
        return cls(rank, p, schedule, compile, table, refresh_calls=envs.get("R2CC_PLAN_REFRESH_CALLS"),
                   refresh_bytes=envs.get("R2CC_PLAN_REFRESH_BYTES"), trial_calls=envs.get("R2CC_PLAN_TRIAL_CALLS"),
                   model=CostModel(alpha_s=envs.get("R2CC_PLAN_ALPHA_S"),
                                   overhead_s=envs.get("R2CC_PLAN_MSG_OVERHEAD_S")), **kw)

    def exchange_due(self, nbytes: int) -> bool:
        """Must the ranks exchange capacities before this call? (Counts the call.)"""
        return self.agreement is not None and self.agreement.due(nbytes)

    def install(self, capacities: Sequence[int]) -> int:
        """The gathered capacities become the planner's table; returns the epoch."""
        epoch = self.planner.update_bandwidth(self.agreement.table(capacities))
        if self.trials is not None:
            self.trials.forget_before(epoch)
        return epoch

    def baseline(self, nbytes: int) -> str:
        """What the built-in path would run for this size."""
        return builtin_schedule(nbytes, self.one_shot_bytes)

    def select(self, count: int, elem_bytes: int) -> tuple[str, tuple, bool]:
        """(schedule, trial key, builtin) for an all_reduce of ``count`` elements. ``builtin``:
        auto chose what the built-in path runs anyway, so the caller may run that path (same
        bits, no executor) instead of ``program_for``."""
        nbytes = count * elem_bytes
        modeled = self.planner.choose("all_reduce", nbytes, elem_bytes)
        key = (size_bucket(nbytes), elem_bytes, self.planner.epoch)
        if self.trials is None:
            return modeled.schedule, key, False
        baseline = self.baseline(nbytes)
        schedule = self.trials.pick(key, modeled.schedule, baseline)
        return schedule, key, schedule == baseline

    def program_for(self, count: int, elem_bytes: int, schedule: str):
        """This rank's compiled program of ``schedule`` for an all_reduce of ``count`` elements."""
        epoch = self.planner.epoch
        pkey = (count, elem_bytes, epoch, schedule)  # a plan is a function of these (and the knobs)
        hit = self._programs.get(pkey)
        if hit is None:
            plan = plan_of(self._report(count, elem_bytes, schedule, builtin=False), self.p)
            hit = self._programs[pkey] = self._compile(plan.program(self.rank).encode())
            while len(self._programs) > self._max:
                self._programs.popitem(last=False)
        else:
            self._programs.move_to_end(pkey)
        return hit

    def _report(self, count: int, elem_bytes: int, schedule: str, builtin: bool) -> dict:
        if builtin:  # the C++ path: equal shares, no table
            return plan_report(schedule, count, elem_bytes, slice_bytes=self.slice_bytes, path="builtin")
        modeled = self.planner.choose("all_reduce", count * elem_bytes, elem_bytes)
        # The baseline under trial runs unchunked, as the built-in path runs it.
        chunks = modeled.chunks if schedule == modeled.schedule else 1
        return plan_report(schedule, count, elem_bytes, chunks, self.planner.bandwidth, self.slice_bytes)

    def program(self, count: int, elem_bytes: int):
        """This rank's compiled program for an all_reduce of ``count`` elements (what select picks)."""
        return self.program_for(count, elem_bytes, self.select(count, elem_bytes)[0])

    def observe(self, key: tuple, schedule: str, seconds: float) -> bool:
        """Times a call; True when a trial just ended: gather ``trial_medians_us`` and ``decide``."""
        return self.trials is not None and self.trials.observe(key, schedule, seconds)

    def trial_medians_us(self, key: tuple) -> list[int]:
        return self.trials.my_medians_us(key)

    def decide(self, key: tuple, gathered_us: list[list[int]]) -> str:
        return self.trials.decide(key, gathered_us)

    @contextmanager
    def all_reduce(self, count: int, elem_bytes: int, gather: Callable[[list[int]], list[list[int]]],
                   capacity: Callable[[], int]) -> Iterator[object]:
        """The whole planned-all_reduce protocol, around the caller's run of it::

            with sched.all_reduce(count, elem_bytes, gather, capacity) as program:
                run program (None: the built-in C++ path: auto chose what it runs anyway, same bits)

        ``gather(mine)``: every rank's list of ints in rank order (one all_gather; every rank calls
        it at the same points); ``capacity()``: this rank's bytes/s now, asked only when an
        exchange is due. The body is timed for the trials, and ``ran`` reports it; a body that
        raises counts for neither."""
        if self.exchange_due(count * elem_bytes):
            self.install([v[0] for v in gather([capacity()])])
        schedule, key, builtin = self.select(count, elem_bytes)
        t0 = time.perf_counter()  # a plan's first call is timed with its compilation, as it costs that
        yield None if builtin else self.program_for(count, elem_bytes, schedule)
        if self.observe(key, schedule, time.perf_counter() - t0):  # a trial ended: the ranks compare
            self.decide(key, gather(self.trial_medians_us(key)))
        self._ran[(count, elem_bytes)] = (schedule, builtin, self.planner.epoch)
        self._ran.move_to_end((count, elem_bytes))
        while len(self._ran) > self._max:
            self._ran.popitem(last=False)

    def ran(self, count: int, elem_bytes: int) -> dict | None:
        """``plan_report`` of the last all_reduce of this shape (None: none ran, or too long ago)."""
        hit = self._ran.get((count, elem_bytes))
        if hit is None:
            return None
        schedule, builtin, epoch = hit
        if epoch != self.planner.epoch:  # planned from an older table, which is gone
            return None
        return self._report(count, elem_bytes, schedule, builtin)

    def describe(self) -> dict:
        """For operators: the schedule knob, the planner's epoch, table and choices, the trials."""
        return {"schedule": self.schedule, "exchanges": self.agreement.exchanges if self.agreement else 0,
                **self.planner.describe(), "trials": self.trials.describe() if self.trials else []}
