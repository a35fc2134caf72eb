"""Deterministic inputs and locally computed references for each op (float32).

Every rank can regenerate every other rank's input from (seed, rank, size), so the reference is
computed locally with no extra traffic. Sums run in rank order 0, 1, 2, ... in float32: the
canonical order r2cc promises, so its result must match bit for bit.
"""

from __future__ import annotations

import torch

SEED = 20240611
ROOT = 0  # broadcast source


def rank_input(rank: int, numel: int, size: int) -> torch.Tensor:
    """Values in [-1, 1): random enough that the summation order changes low bits."""
    g = torch.Generator().manual_seed(SEED + 1_000_003 * rank + size)
    return torch.empty(numel, dtype=torch.float32).uniform_(-1.0, 1.0, generator=g)


def input_numel(op: str, size: int, world: int) -> int:
    """Elements of one rank's input buffer (size is the nccl-tests message size)."""
    if op == "all_gather":
        return size // 4 // world
    return size // 4


def make_input(op: str, rank: int, size: int, world: int) -> torch.Tensor:
    return rank_input(rank, input_numel(op, size, world), size)


def reference(op: str, rank: int, size: int, world: int) -> torch.Tensor:
    """What `rank` must hold after the op."""
    n = input_numel(op, size, world)
    if op == "broadcast":
        return rank_input(ROOT, n, size)
    if op == "all_gather":
        return torch.cat([rank_input(r, n, size) for r in range(world)])
    acc = rank_input(0, n, size)
    for r in range(1, world):
        acc += rank_input(r, n, size)  # in place, one rank at a time: float32, rank order
    if op == "reduce_scatter":
        block = n // world
        return acc[rank * block:(rank + 1) * block].clone()
    return acc


def compare(out: torch.Tensor, ref: torch.Tensor) -> tuple[bool, bool, float]:
    """(bit_exact, close, max_abs_err). close allows reordered float32 sums."""
    out = out.reshape(-1)
    if out.shape != ref.shape:
        return False, False, float("inf")
    if torch.equal(out, ref):
        return True, True, 0.0
    err = float((out - ref).abs().max())
    return False, bool(torch.allclose(out, ref, rtol=1e-5, atol=1e-5)), err
