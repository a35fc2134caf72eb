"""Parsing of the bench command line: sizes, backends, ops and fault specs.

Everything here is pure (no lab, no processes) so bad input fails before anything is built.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from r2cc_serve.errors import UserError

BACKENDS = ("r2cc", "gloo", "mpi")
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
FAULT_KINDS = ("down", "blackhole", "degrade", "flap")
DEFAULT_FAULT_AT = 0.30  # fraction of the fault-free duration

_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
_SIZE_RE = re.compile(r"^(\d+)\s*([KMG]?)(?:I?B)?$", re.IGNORECASE)
# h<host>:<rail>:<kind>[:<args>...][@<percent>%]
_FAULT_RE = re.compile(r"^h?(\d+):(?:rail)?(\d+):([a-z]+)((?::[^:@]+)*)(?:@(\d+(?:\.\d+)?)%)?$")


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


def check_op_size(op: str, size: int, world: int) -> None:
    """Sizes follow nccl-tests: all_gather/reduce_scatter sizes are the full (world-sized) buffer."""
    if size % 4:
        raise UserError(f"size {size} is not a multiple of 4 bytes (float32 elements)")
    if op in ("all_gather", "reduce_scatter") and size % (4 * world):
        raise UserError(f"{op} size {size} must split into {world} float32 blocks "
                        f"(a multiple of {4 * world} bytes)")


@dataclass(frozen=True)
class FaultSpec:
    """One lab fault on one host's rail, injected `at` (fraction) into a fault-free duration."""
    text: str
    host: int
    rail: int
    kind: str
    arg: object  # None, a rate string (degrade) or (period_ms, count) (flap)
    at: float

    def to_dict(self) -> dict:
        d = asdict(self)
        d["arg"] = list(self.arg) if isinstance(self.arg, tuple) else self.arg
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "FaultSpec":
        arg = tuple(d["arg"]) if isinstance(d["arg"], list) else d["arg"]
        return cls(d["text"], d["host"], d["rail"], d["kind"], arg, d["at"])


def parse_fault(text: str, hosts: int, rails: int) -> FaultSpec:
    """'h0:1:down@30%', 'h1:2:blackhole', 'h0:0:degrade:100mbit@50%', 'h0:3:flap:200:3@10%'."""
    m = _FAULT_RE.match(text.strip())
    if not m:
        raise UserError(f"--fault {text!r} is not valid: use h<HOST>:<RAIL>:<KIND>[:ARGS][@<PCT>%], "
                        "e.g. h0:1:down@30%, h0:1:degrade:100mbit@30%, h0:1:flap:200:3@30%")
    host, rail, kind = int(m.group(1)), int(m.group(2)), m.group(3)
    args = [a for a in m.group(4).split(":") if a]
    at = float(m.group(5)) / 100 if m.group(5) else DEFAULT_FAULT_AT
    if kind not in FAULT_KINDS:
        raise UserError(f"--fault {text!r}: kind must be one of {', '.join(FAULT_KINDS)}")
    if not 0 <= host < hosts:
        raise UserError(f"--fault {text!r}: host {host} is outside 0..{hosts - 1}")
    if not 0 <= rail < rails:
        raise UserError(f"--fault {text!r}: rail {rail} is outside 0..{rails - 1}")
    if rails < 2:
        raise UserError("--fault needs at least 2 rails: the survivors carry the traffic")
    if not 0 <= at <= 10:
        raise UserError(f"--fault {text!r}: the percentage must be between 0 and 1000")
    arg: object = None
    if kind == "degrade":
        if len(args) != 1:
            raise UserError(f"--fault {text!r}: degrade takes one rate, e.g. h0:1:degrade:100mbit")
        from r2cc_serve.lab.layout import check_rate
        arg = check_rate(args[0])
    elif kind == "flap":
        try:
            period_ms, count = (int(a) for a in args)
        except ValueError:
            raise UserError(f"--fault {text!r}: flap takes PERIOD_MS:COUNT, e.g. h0:1:flap:200:3") from None
        arg = (period_ms, count)
    elif args:
        raise UserError(f"--fault {text!r}: {kind} takes no arguments")
    return FaultSpec(text.strip(), host, rail, kind, arg, at)
