"""Plans: a collective as data, one program of steps per rank, run by one generic executor.

A program is a list of steps over three buffers of one rank, addressed in elements:
``in`` (the input, ``count`` elements, read-only), ``out`` (the result, ``count`` elements) and
``scratch`` (``Program.scratch`` elements). A region is (buffer, offset, length).

Steps (``kind``):

- SEND(peer, region): put the region on the wire to ``peer``.
- RECV(peer, region): write the next message from ``peer`` into the region.
- REDUCE(region, sources): ``region = op(...op(src0, src1)..., srcN)``, one call of the C++
  ``reduce_in_order`` over the sources in the order given (16-bit floats: fp32 accumulate,
  one rounding). Every source has the region's length; the region may alias a source.
- COPY(region, source): memmove.

Executor contract (what a C++ runner must do, and all it needs to know):

- A step may start once every step in its ``deps`` (earlier steps of the same rank) has completed;
  apart from that, steps run in any order and may overlap.
- Messages match by order per (sender, receiver) pair: the k-th SEND from a to b in a's list is
  the k-th RECV from a in b's list, and has the same length. Per pair, sends go on the wire in
  list order (a send does not start before the previous send to that peer has started).
- A SEND completes when its bytes are handed over and acknowledged (the region may be reused);
  a RECV when the region holds the message; REDUCE/COPY when written.
- ``in`` and ``out`` must not alias: an in-place caller copies its input first.
- The plan is data: ``Program.encode()`` gives a flat little-endian form (see there).

``validate.validate(plan)`` checks a plan statically, and by symbolic execution that it computes the
all-reduce with every element folded in rank order (see ``r2cc_serve.sched.validate``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

SEND, RECV, REDUCE, COPY = 0, 1, 2, 3
KIND_NAMES = ("send", "recv", "reduce", "copy")
IN, OUT, SCRATCH = 0, 1, 2
BUFFER_NAMES = ("in", "out", "scratch")

_MAGIC = b"R2PL"
_VERSION = 1


@dataclass(frozen=True)
class Program:
    """One rank's steps as parallel arrays (struct of arrays keeps 1024-rank plans small).

    ``buf/off/length``: the region a step writes (RECV, REDUCE, COPY) or reads (SEND).
    ``src_ptr`` (CSR over steps) indexes ``src_buf/src_off``: the sources of REDUCE/COPY, each
    ``length`` long. ``dep_ptr`` (CSR) indexes ``dep_idx``: earlier steps this one waits for.
    """

    kind: np.ndarray
    peer: np.ndarray
    buf: np.ndarray
    off: np.ndarray
    length: np.ndarray
    src_ptr: np.ndarray
    src_buf: np.ndarray
    src_off: np.ndarray
    dep_ptr: np.ndarray
    dep_idx: np.ndarray
    scratch: int

    def __len__(self) -> int:
        return len(self.kind)

    def deps(self, i: int) -> np.ndarray:
        return self.dep_idx[self.dep_ptr[i]:self.dep_ptr[i + 1]]

    def sources(self, i: int) -> list[tuple[int, int]]:
        lo, hi = self.src_ptr[i], self.src_ptr[i + 1]
        return list(zip(self.src_buf[lo:hi].tolist(), self.src_off[lo:hi].tolist()))

    def describe(self, i: int) -> str:
        k = KIND_NAMES[self.kind[i]]
        region = f"{BUFFER_NAMES[self.buf[i]]}[{self.off[i]}:{self.off[i] + self.length[i]}]"
        peer = f" peer {self.peer[i]}" if self.kind[i] in (SEND, RECV) else ""
        return f"step {i} {k}{peer} {region}"

    def encode(self) -> bytes:
        """Flat form for the C++ executor.

        Header ``<4s I Q Q Q Q``: magic b"R2PL", version, steps n, sources m, deps e, scratch
        elements. Then int64 little-endian arrays in this order: kind[n], peer[n], buf[n],
        off[n], length[n], src_ptr[n+1], src_buf[m], src_off[m], dep_ptr[n+1], dep_idx[e].
        """
        n, m, e = len(self), len(self.src_buf), len(self.dep_idx)
        parts = [struct.pack("<4sIQQQQ", _MAGIC, _VERSION, n, m, e, self.scratch)]
        for name in _ARRAY_ORDER:
            parts.append(np.ascontiguousarray(getattr(self, name), dtype="<i8").tobytes())
        return b"".join(parts)

    @staticmethod
    def decode(data: bytes) -> "Program":
        magic, version, n, m, e, scratch = struct.unpack_from("<4sIQQQQ", data)
        if magic != _MAGIC or version != _VERSION:
            raise ValueError(f"not an r2cc plan (magic {magic!r}, version {version})")
        pos = struct.calcsize("<4sIQQQQ")
        lengths = {"src_ptr": n + 1, "dep_ptr": n + 1, "src_buf": m, "src_off": m, "dep_idx": e}
        arrays = {}
        for name in _ARRAY_ORDER:
            k = lengths.get(name, n)
            arrays[name] = np.frombuffer(data, dtype="<i8", count=k, offset=pos).copy()
            pos += 8 * k
        return _typed_program(arrays, int(scratch))


_ARRAY_ORDER = ("kind", "peer", "buf", "off", "length", "src_ptr", "src_buf", "src_off", "dep_ptr", "dep_idx")
_DTYPES = {"kind": np.int8, "peer": np.int32, "buf": np.int8, "off": np.int64, "length": np.int64,
           "src_ptr": np.int64, "src_buf": np.int8, "src_off": np.int64, "dep_ptr": np.int64, "dep_idx": np.int64}


def _typed_program(arrays: dict, scratch: int) -> Program:
    return Program(**{k: np.asarray(v, dtype=_DTYPES[k]) for k, v in arrays.items()}, scratch=scratch)


class ProgramBuilder:
    """Appends steps in batches: one call adds n steps that differ only in their array arguments.

    Builders call this a few times per micro-chunk, never once per element, so a 1024-rank
    program of 10^5 steps builds in milliseconds.
    """

    def __init__(self) -> None:
        self._batches: list[dict] = []
        self.n = 0
        self.scratch = 0

    def add(self, kind: int, peer=-1, buf=OUT, off=0, length=0, deps=(), src_buf=None, src_off=None) -> np.ndarray:
        """Add steps; returns their indices. Scalars broadcast over the batch.

        ``deps``: a 1-D sequence shared by every new step, or a 2-D array (one row per step).
        ``src_buf/src_off``: 1-D (shared) or 2-D (one row of sources per step).
        """
        cols = [np.asarray(x) for x in (peer, buf, off, length)]
        n = max([c.size for c in cols if c.ndim] + [1])
        peer, buf, off, length = (np.broadcast_to(c, (n,)) for c in cols)
        d = np.asarray(deps, dtype=np.int64)
        d = np.broadcast_to(d, (n, d.size)) if d.ndim <= 1 else d
        if src_buf is None:
            sb = so = np.zeros((n, 0), dtype=np.int64)
        else:
            sb, so = np.asarray(src_buf), np.asarray(src_off)
            sb = np.broadcast_to(sb, (n, sb.shape[-1])) if sb.ndim <= 1 else sb
            so = np.broadcast_to(so, (n, so.shape[-1])) if so.ndim <= 1 else so
        if d.size and d.max() >= self.n:
            raise ValueError("a step may only depend on steps added before it")
        self._batches.append(dict(kind=np.full(n, kind), peer=peer, buf=buf, off=off, length=length,
                                  deps=d, src_buf=sb, src_off=so))
        first = self.n
        self.n += n
        return np.arange(first, self.n)

    def need_scratch(self, elements: int) -> None:
        self.scratch = max(self.scratch, int(elements))

    def build(self) -> Program:
        b = self._batches
        if not b:
            empty = np.zeros(0, dtype=np.int64)
            return _typed_program(dict(kind=empty, peer=empty, buf=empty, off=empty, length=empty,
                                       src_ptr=np.zeros(1), src_buf=empty, src_off=empty,
                                       dep_ptr=np.zeros(1), dep_idx=empty), self.scratch)
        out = {k: np.concatenate([x[k] for x in b]) for k in ("kind", "peer", "buf", "off", "length")}
        out["dep_ptr"], out["dep_idx"] = _csr([x["deps"] for x in b])
        out["src_ptr"], out["src_buf"] = _csr([x["src_buf"] for x in b])
        out["src_off"] = _csr([x["src_off"] for x in b])[1]
        return _typed_program(out, self.scratch)


def _csr(blocks: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of 2-D blocks (each block has a fixed row width) as (ptr, flat)."""
    widths = np.concatenate([np.full(len(x), x.shape[1], dtype=np.int64) for x in blocks])
    ptr = np.zeros(len(widths) + 1, dtype=np.int64)
    np.cumsum(widths, out=ptr[1:])
    flat = np.concatenate([x.reshape(-1) for x in blocks]) if blocks else np.zeros(0, dtype=np.int64)
    return ptr, flat


@dataclass(frozen=True)
class Symmetry:
    """Rank relabelings under which the plan's timing (not its regions) stays the same.

    Each generator is a tuple of equally long cycles of ranks, rotated together by one position;
    generators move disjoint ranks, and ranks in no generator stay put. The simulator uses this
    to run one representative per cycle instead of every rank. A builder that declares a
    symmetry promises: relabel ranks by any product of generator powers and every rank's program
    keeps its kinds, lengths, dependencies and per-pair message order (tests check this by
    simulating with and without the symmetry).
    """

    generators: tuple[tuple[tuple[int, ...], ...], ...] = ()

    def orbit_info(self, p: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per rank: generator id (-1: fixed), cycle id (a class id), index in the cycle, class size."""
        gen = np.full(p, -1, dtype=np.int64)
        cls = np.arange(p, dtype=np.int64) + 10**9  # fixed ranks: a class of their own
        idx = np.zeros(p, dtype=np.int64)
        size = np.ones(p, dtype=np.int64)
        next_cls = 0
        for g, cycles in enumerate(self.generators):
            n = len(cycles[0])
            for cyc in cycles:
                if len(cyc) != n:
                    raise ValueError("cycles of one generator must have equal length")
                c = np.asarray(cyc, dtype=np.int64)
                if np.any(gen[c] >= 0):
                    raise ValueError("generators must move disjoint ranks")
                gen[c], cls[c], idx[c], size[c] = g, next_cls, np.arange(n), n
                next_cls += 1
        return gen, cls, idx, size


@dataclass
class Plan:
    """An all-reduce of ``count`` elements of ``elem_bytes`` each over ``p`` ranks.

    Programs are made on demand (``program(rank)``): an executor needs only its own, and the
    simulator only one per symmetry class. ``canonical`` is the builder's claim that every
    output element is one rank-order reduce of raw inputs (bit-identical to every other
    canonical schedule); ``validate`` checks it.
    """

    schedule: str
    p: int
    count: int
    elem_bytes: int
    make_program: Callable[[int], Program]
    symmetry: Symmetry = field(default_factory=Symmetry)
    canonical: bool = True
    info: dict = field(default_factory=dict)
    op: str = "all_reduce"
    _cache: dict = field(default_factory=dict, repr=False)

    def program(self, rank: int) -> Program:
        if not 0 <= rank < self.p:
            raise IndexError(f"rank {rank} outside a plan of {self.p} ranks")
        if rank not in self._cache:
            self._cache[rank] = self.make_program(rank)
        return self._cache[rank]

    def programs(self) -> list[Program]:
        return [self.program(r) for r in range(self.p)]

    @property
    def nbytes(self) -> int:
        return self.count * self.elem_bytes

    def summary(self) -> dict:
        """JSON-able description (for the admin API and `r2cc sim --json`)."""
        return {"op": self.op, "schedule": self.schedule, "p": self.p, "count": self.count,
                "elem_bytes": self.elem_bytes, "canonical": self.canonical, **self.info}


class PlanError(ValueError):
    """A plan that an executor must not run; the message names the rank and step."""


def message_index(prog: Program, kind: int) -> np.ndarray:
    """For each step of ``kind``: how many earlier steps of that kind share its peer (0-based).

    That is the message's position on its (sender, receiver) pair, which is how sends and
    recvs match. Returns -1 for steps of other kinds.
    """
    out = np.full(len(prog), -1, dtype=np.int64)
    sel = np.flatnonzero(prog.kind == kind)
    if sel.size:
        order = sel[np.argsort(prog.peer[sel], kind="stable")]
        peers = prog.peer[order]
        starts = np.r_[0, np.flatnonzero(np.diff(peers)) + 1]
        run_start = np.repeat(starts, np.diff(np.r_[starts, len(order)]))
        out[order] = np.arange(len(order)) - run_start
    return out


def steps_of(prog: Program, kinds: Sequence[int]) -> np.ndarray:
    return np.flatnonzero(np.isin(prog.kind, kinds))
