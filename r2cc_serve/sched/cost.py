"""All-reduce time: the lower bound, closed forms of each schedule, and an alpha-beta estimate.

Units: M bytes per rank, B bytes/s the best rank's NIC (each direction), ``beta_i`` the fraction
rank i keeps. Every formula here was re-derived, not copied; what we found about the ones in
issue 11 / docs/design.md, "Facts the code relies on":

- Lower bound (right). Each rank must receive at least M (one value per element, whatever
  the schedule) and send at least M (its input matters to every element), so T >= M/(B min
  beta). All ranks together must move at least 2(p-1)M (the classic all-reduce traffic bound),
  at most B sum(beta) per second, so T >= 2(p-1)M/(B sum beta). With one straggler,
  sum beta = p-1+beta: ``T_LB = max(M/(beta B), 2(p-1)M/((p-1+beta)B))``.
- Shares (right). In the owner-computes schedule (every rank owns a share x_i, receives the raw
  contributions to it and sends the result to all) rank i sends (1-x_i)M + (p-1)x_i M =
  (1+(p-2)x_i)M and receives the same. Equal times give ``1 + (p-2)x_i = beta_i T`` and, as the
  shares sum to 1, T = 2(p-1)/sum(beta): the bound. Where some beta_i T < 1 those ranks get x_i = 0
  and T = 1/min(beta); since every rank then has beta_i T >= 1, the closed form
  ``T = max(1/min beta, 2(p-1)/sum beta)`` is exact for the schedule, not just a bound: no LP
  needed while per-rank in and out are used through min(in, out) (a rank here sends what it
  receives). One straggler: ``x_S = (beta(2p-3)-(p-1))/((p-2)(p-1+beta))``, zero below
  ``beta = (p-1)/(2p-3)``, as the issue says. The issue's worked values hold (p=4 beta=.75:
  x_S=0.1, T=1.6; see tests). One correction: at p=2 the share formula divides by p-2 = 0; there
  every share gives T = 1/min(beta), the plain schedule, so we keep equal shares.
- Ring / equal shares under a straggler: ``2(p-1)M/(p beta B)`` (right): the straggler moves
  2(p-1)/p of M each way at beta B; the ratio to fault-free is 1/beta.
- Pipelining: when the slowest rank owns nothing, what it receives depends on what it sent first,
  so its in-link idles for one micro-chunk: T ~ T_LB (1 + 1/K) (right; the simulator shows it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from r2cc_serve.errors import UserError
from r2cc_serve.sched.bandwidth import Bandwidth


def beta_vector(p: int, betas) -> np.ndarray:
    """Per-rank fractions from: a float (rank p-1 degraded), p floats, or fewer floats (the last
    ranks degraded, the rest at 1)."""
    if p < 1:
        raise UserError(f"a group needs at least one rank, got p={p}")
    b = np.atleast_1d(np.asarray(betas, dtype=np.float64))
    if b.size > p:
        raise UserError(f"{b.size} bandwidth fractions for {p} ranks")
    if np.any(~np.isfinite(b)) or np.any(b <= 0):
        raise UserError("bandwidth fractions must be positive")
    full = np.ones(p)
    full[p - b.size:] = b
    return full


def lower_bound(p: int, betas, M: float, B: float) -> float:
    """Fastest possible all-reduce of M bytes: ``max(M/(B min beta), 2(p-1)M/(B sum beta))``.

    ``betas``: one float (a single straggler; T_LB = max(M/(beta B), 2(p-1)M/((p-1+beta)B))),
    or the fractions of the degraded ranks, or all p of them.
    """
    if p == 1:
        return 0.0
    b = beta_vector(p, betas)
    return max(M / (B * b.min()), 2 * (p - 1) * M / (B * b.sum()))


def lower_bound_of(bw: Bandwidth, M: float) -> float:
    """The bound for a table with distinct in/out capacities per rank."""
    p = bw.p
    if p == 1:
        return 0.0
    per_rank = M / min(bw.out_Bps.min(), bw.in_Bps.min())
    total = 2 * (p - 1) * M / min(bw.out_Bps.sum(), bw.in_Bps.sum())
    return max(per_rank, total)


def fault_free_time(p: int, M: float, B: float) -> float:
    return 2 * (p - 1) * M / (p * B)


def equal_share_time(p: int, betas, M: float, B: float) -> float:
    """Ring, or today's direct schedule (equal shares), under stragglers: 2(p-1)M/(p B min beta)."""
    return 2 * (p - 1) * M / (p * B * beta_vector(p, betas).min())


def straggler_share(p: int, beta: float) -> float:
    """One straggler's optimal share (the issue's closed form); 0 below beta = (p-1)/(2p-3)."""
    if p <= 2:
        return 1.0 / p
    return max(0.0, (beta * (2 * p - 3) - (p - 1)) / ((p - 2) * (p - 1 + beta)))


def optcc_shares(betas: Sequence[float]) -> np.ndarray:
    """Shares x_i (summing to 1) that make the owner-computes schedule reach the lower bound.

    Each rank may take up to cap_i = (beta_i T - 1)/(p-2) at T = max(1/min beta, 2(p-1)/sum beta);
    the caps sum to at least 1 (exactly 1 in the balanced case), and we scale them down to 1.
    """
    b = np.asarray(betas, dtype=np.float64)
    p = b.size
    if p <= 2:
        return np.full(p, 1.0 / p)
    T = max(1.0 / b.min(), 2.0 * (p - 1) / b.sum())
    cap = np.maximum(b * T - 1.0, 0.0) / (p - 2)
    return cap / cap.sum()


def owner_computes_time(shares: np.ndarray, bw: Bandwidth, M: float) -> float:
    """Bandwidth term of the owner-computes schedule (direct, optcc) for given shares."""
    p = bw.p
    if p == 1:
        return 0.0
    traffic = (1.0 + (p - 2) * np.asarray(shares)) * M
    return float(np.max(traffic / bw.link_Bps))


@dataclass(frozen=True)
class CostModel:
    """Alpha-beta model: ``alpha_s`` per message hop on the critical path, ``overhead_s`` per
    message on the busiest rank (framing, syscalls), NIC bandwidth per rank and direction,
    ``reduce_Bps`` bytes of inputs folded per second (0: free). Micro-chunks are at least
    ``min_piece_bytes`` per message and at most ``max_chunks``."""

    alpha_s: float = 20e-6
    overhead_s: float = 1e-6
    reduce_Bps: float = 10e9
    min_piece_bytes: int = 4096
    max_chunks: int = 64


@dataclass(frozen=True)
class Estimate:
    schedule: str
    seconds: float
    bandwidth_s: float  # the bytes/bandwidth term alone
    chunks: int
    shares: tuple = ()


def schedule_traffic(schedule: str, bw: Bandwidth) -> tuple[np.ndarray, np.ndarray]:
    """Bytes each rank sends and receives, per byte of M."""
    p = bw.p
    if schedule == "one_shot":
        t = np.full(p, float(p - 1))
        return t, t
    if schedule in ("direct", "ring"):
        t = np.full(p, 2.0 * (p - 1) / p)
        return t, t
    if schedule == "optcc":
        t = 1.0 + (p - 2) * optcc_shares(bw.betas)
        return t, t
    if schedule == "r2ccl":
        degraded, healthy = split_degraded(bw)
        h, out, inn = len(healthy), np.zeros(p), np.zeros(p)
        out[healthy] = inn[healthy] = 2.0 * (h - 1) / h
        inn[healthy] += len(degraded) / h
        for j, s in enumerate(degraded):
            out[healthy[j % h]] += 1.0  # the root that forwards the result to straggler s
        out[degraded] = inn[degraded] = 1.0
        return out, inn
    raise UserError(f"unknown schedule {schedule!r}")


def pipeline_fill(schedule: str, bw: Bandwidth, M: float, chunks) -> np.ndarray:
    """Seconds the slowest rank's in-link idles at the start, for each K in ``chunks``.

    optcc: the slowest rank S first receives the raw pieces of its own share from the h full-speed
    ranks, h x_S M; the first result it can receive needs its first chunk out, (1-x_S)M/K. The gap
    ``max(0, (1-x_S)/K - h x_S) M/(beta_S B)`` adds to T_LB: T_LB(1+1/K) when x_S = 0, nothing once
    K >= (1-x_S)/(h x_S). With one straggler (h = p-1) the simulator matches this exactly; with
    several, it leaves a 0-3% gap the model does not see. r2ccl: about one chunk of the
    straggler's ingest (rough).
    """
    K = np.asarray(chunks, dtype=np.float64)
    s = int(np.argmin(bw.link_Bps))
    if schedule == "optcc":
        x = optcc_shares(bw.betas)
        fast = int(np.count_nonzero(bw.link_Bps == bw.link_Bps.max()))
        return np.maximum(0.0, (1 - x[s]) / K - fast * x[s]) * M / bw.link_Bps[s]
    if schedule == "r2ccl" and split_degraded(bw)[0]:
        return M / (K * bw.link_Bps[s])
    return np.zeros_like(K)


def chunk_tail(schedule: str, bw: Bandwidth, M: float, chunks) -> np.ndarray:
    """One micro-chunk of the slowest rank's traffic at its link, for each K (see choose_chunks)."""
    K = np.asarray(chunks, dtype=np.float64)
    if schedule != "optcc" or not split_degraded(bw)[0]:  # no straggler: optcc is direct, unpipelined
        return np.zeros_like(K)
    s = int(np.argmin(bw.link_Bps))
    return (1 - optcc_shares(bw.betas)[s]) / K * M / bw.link_Bps[s]


def split_degraded(bw: Bandwidth) -> tuple[list[int], list[int]]:
    """(degraded ranks, healthy ranks): degraded means below the best rank's capacity."""
    best = bw.link_Bps.max()
    degraded = [r for r in range(bw.p) if bw.link_Bps[r] < best]
    return degraded, [r for r in range(bw.p) if r not in degraded]


def estimate(schedule: str, bw: Bandwidth, nbytes: float, model: CostModel = CostModel(),
             elem_bytes: int = 4) -> Estimate:
    """Seconds for one all-reduce of ``nbytes`` per rank under the model, and the chunk count."""
    p = bw.p
    if p == 1:
        return Estimate(schedule, 0.0, 0.0, 1)
    out, inn = schedule_traffic(schedule, bw)
    t_bw = float(np.max(np.maximum(out * nbytes / bw.out_Bps, inn * nbytes / bw.in_Bps)))
    msgs, rounds = _shape(schedule, p)
    chunks, fill = 1, 0.0
    if schedule in ("optcc", "r2ccl"):
        chunks, fill = choose_chunks(schedule, bw, nbytes, model, msgs, elem_bytes)
    seconds = model.alpha_s * rounds + model.overhead_s * msgs * chunks + t_bw + fill
    if model.reduce_Bps > 0:
        seconds += _reduce_tail_bytes(schedule, p, nbytes, chunks) / model.reduce_Bps
    shares = tuple(optcc_shares(bw.betas).tolist()) if schedule == "optcc" else ()
    return Estimate(schedule, seconds, t_bw, chunks, shares)


def _shape(schedule: str, p: int) -> tuple[int, int]:
    """(messages per chunk on a busy rank, message delays on the critical path)."""
    if schedule == "one_shot":
        return p - 1, 1
    if schedule == "ring":
        return 2 * (p - 1), 2 * (p - 1)
    return 2 * (p - 1), {"direct": 2, "optcc": 2, "r2ccl": 3}[schedule]


def _reduce_tail_bytes(schedule: str, p: int, nbytes: float, chunks: int) -> float:
    """Input bytes folded after the last byte arrives (the rest overlaps the transfers)."""
    if schedule == "one_shot":
        return p * nbytes
    if schedule == "ring":  # every step's fold is on the critical path
        return 2.0 * (p - 1) / p * nbytes
    if schedule == "direct":
        chunks = max(1, math.ceil(nbytes / p / DIRECT_SLICE_BYTES))
    return nbytes / chunks


DIRECT_SLICE_BYTES = 4 << 20  # R2CC_PIPELINE_BYTES, as builders.direct uses it


def choose_chunks(schedule: str, bw: Bandwidth, nbytes: float, model: CostModel, msgs_per_chunk: int,
                  elem_bytes: int = 4) -> tuple[int, float]:
    """(K, its fill) minimizing fill + per-message overhead, pieces >= min_piece_bytes.

    The fill charged is at least one chunk of the straggler's traffic at its link,
    (1 - x_S) M / (K beta_S B) (``chunk_tail``), even where the fluid simulator needs none
    (pipeline_fill is 0 once K >= (1-x_S)/(h x_S)): on real sockets few chunks measured slower
    (lab, 4 hosts, one at beta 0.75, 64 MiB: K=3 ran 12% over the simulator, K=64 7%), as
    stages hand over whole messages and TCP does not share links as a fluid.
    Ties go to more chunks: with no per-message cost that is never slower (see pipeline_fill)."""
    largest = largest_share_bytes(schedule, bw, nbytes)
    k_max = int(max(1, min(model.max_chunks, largest // max(model.min_piece_bytes, elem_bytes, 1))))
    ks = np.arange(1, k_max + 1)
    fill = np.maximum(pipeline_fill(schedule, bw, nbytes, ks), chunk_tail(schedule, bw, nbytes, ks))
    total = fill + model.overhead_s * msgs_per_chunk * ks
    best = int(np.flatnonzero(total <= total.min() * (1 + 1e-9) + 1e-15)[-1])
    return int(ks[best]), float(fill[best])


def largest_share_bytes(schedule: str, bw: Bandwidth, nbytes: float) -> float:
    """The largest owner share. Micro-chunks cut every share K ways; a tiny share (a straggler's)
    may get tiny or empty pieces, which costs nothing, so the piece limit follows the big shares."""
    if schedule == "optcc":
        return float(optcc_shares(bw.betas).max() * nbytes)
    return float(nbytes / max(1, len(split_degraded(bw)[1])))
