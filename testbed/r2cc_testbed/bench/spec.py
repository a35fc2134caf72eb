"""Parsing of the bench command line: sizes, backends, ops and fault specs.

Everything here is pure (no lab, no processes) so bad input fails before anything is built.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from r2cc_serve.errors import UserError
from r2cc_serve.health.monitor import SPIN_COUNTERS
from r2cc_testbed.lab import baselines
from r2cc_testbed.faults.model import RAIL_FAULTS, STEADY_RAIL_FAULTS, FaultSpec, labelled, parse_timed

# Not a library: a plain TCP ring all_reduce over the same rails, no failover (bench/tcp_floor.py).
FLOOR = "tcp-floor"
BACKENDS = ("r2cc", *baselines.names("gloo"), "mpi", FLOOR)
# r2cc all_reduce schedules (R2CC_SCHEDULE values); builtin is today's fixed C++ path.
SCHEDULES = ("builtin", "auto", "direct", "one_shot", "ring", "optcc")
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
DEFAULT_FAULT_AT = 0.30  # fraction of the fault-free duration

_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
_SIZE_RE = re.compile(r"^(\d+)\s*([KMG]?)(?:I?B)?$", re.IGNORECASE)


# r2cc's counters a bench entry reports for its timed calls (backends.R2ccBackend.wait_counts)
WAIT_COUNTS = SPIN_COUNTERS + ("writer_chunks", "handoffs", "hedges", "watchdog_passes", "watchdog_locked_us",
                               "caller_watchdog_passes")


def parse_size(text: str) -> int:
    """Bytes of '4K', '1M', '64M', '4096' (binary units: 1K = 1024)."""
    m = _SIZE_RE.match(text.strip())
    if not m:
        raise UserError(f"size {text!r} is not valid: use bytes with an optional K/M/G suffix, e.g. 4K,1M,64M")
    n = int(m.group(1)) * _UNITS[m.group(2).upper()]
    if n <= 0:
        raise UserError(f"size {text!r} must be positive")
    return n


def parse_sizes(text: str) -> list[int]:
    sizes = [parse_size(s) for s in text.split(",") if s.strip()]
    if not sizes:
        raise UserError("--sizes needs at least one size, e.g. 4K,1M,64M")
    return sizes


def format_size(n: int) -> str:
    for unit, factor in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if n >= factor and n % factor == 0:
            return f"{n // factor}{unit}"
    return str(n)


def parse_backends(text: str) -> list[str]:
    names = [b.strip().lower() for b in text.split(",") if b.strip()]
    bad = [b for b in names if b not in BACKENDS]
    if bad or not names:
        raise UserError(f"--backend {text!r}: use a comma list of {', '.join(BACKENDS)}")
    if len(set(names)) != len(names):
        raise UserError(f"--backend {text!r} names a backend twice")
    return names


def check_floor(backends: list[str], op: str, faults: list) -> None:
    """tcp-floor is a reference for all_reduce's cost, with no failover to measure."""
    if FLOOR not in backends:
        return
    if op != "all_reduce":
        raise UserError(f"backend {FLOOR} runs all_reduce only (it is the cost floor of a ring all_reduce); "
                        f"drop it for --op {op}")
    if faults and backends == [FLOOR]:
        raise UserError(f"backend {FLOOR} has no failover, so --fault has nothing to measure on it; "
                        "add r2cc, gloo or mpi (faults skip tcp-floor)")


def parse_schedules(text: str | None, op: str, backends: list[str]) -> list[str]:
    """'direct,optcc' -> ['direct', 'optcc']; None -> [] (r2cc runs its configured path)."""
    if text is None:
        return []
    names = [x.strip().lower() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in SCHEDULES]
    if bad or not names or len(set(names)) != len(names):
        raise UserError(f"--schedule {text!r}: use a comma list of {', '.join(SCHEDULES)}, each once")
    if op != "all_reduce" or "r2cc" not in backends:
        raise UserError("--schedule picks r2cc's all_reduce schedule: it needs --op all_reduce and backend r2cc")
    return names


def check_op_size(op: str, size: int, world: int) -> None:
    """Sizes follow nccl-tests: all_gather/reduce_scatter sizes are the full (world-sized) buffer."""
    if size % 4:
        raise UserError(f"size {size} is not a multiple of 4 bytes (float32 elements)")
    if op in ("all_gather", "reduce_scatter") and size % (4 * world):
        raise UserError(f"{op} size {size} must split into {world} float32 blocks "
                        f"(a multiple of {4 * world} bytes)")


@dataclass(frozen=True)
class BenchFault:
    """A lab fault (r2cc_testbed.faults.model) injected `at` (a fraction) into a fault-free op's duration."""
    text: str  # as the user wrote it, for the report
    fault: FaultSpec
    at: float

    def to_dict(self) -> dict:
        return {"text": self.text, "at": self.at, "fault": dataclasses.asdict(self.fault)}

    @classmethod
    def from_dict(cls, d: dict) -> "BenchFault":
        return cls(d["text"], FaultSpec(**d["fault"]), d["at"])


def parse_fault(text: str, hosts: int, rails: int) -> BenchFault:
    """'h0:1:down@30%', 'h1:2:blackhole', 'h0:0:degrade:100mbit@50%', 'h0:3:flap:200:3@10%', 'h0:1:gray:out@30%'
    (the fault notation, faults/timing.py; @ is a share of the op, DEFAULT_FAULT_AT when left out)."""
    timed = parse_timed(text, RAIL_FAULTS, at="share", hold=False, label=f"--fault {text.strip()!r}")
    with labelled(f"--fault {timed.text!r}"):
        fault = timed.spec.check_target(hosts, rails)
        if rails < 2:
            raise UserError("needs at least 2 rails: the survivors carry the traffic")
    return BenchFault(timed.text, fault, DEFAULT_FAULT_AT if timed.share is None else timed.share)


HOLD_KINDS = STEADY_RAIL_FAULTS + ("drain",)  # drain: the rank of that host drains the rail itself


def parse_hold(text: str, hosts: int, rails: int) -> BenchFault:
    """A fault held for the whole r2cc launch (set after the group is up): 'h3:2:down',
    'h1:0:degrade:125mbit', 'h0:1:lossy:1', 'h0:1:gray:in:600', 'h0:1:marginal:90', or 'h0:1:drain'
    (the same rail out of service, for comparison). No @ or +: it stays for the whole launch."""
    label = f"--hold-fault {text.strip()!r}"
    timed = parse_timed(text, HOLD_KINDS, at="none", hold=False, label=label)
    with labelled(label):
        return BenchFault(timed.text, timed.spec.check_target(hosts, rails), 0.0)
