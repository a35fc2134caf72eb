"""Per-rank network capacity: what a rank can send and receive per second over all its rails."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from r2cc_serve.errors import UserError


@dataclass(frozen=True, eq=False)
class Bandwidth:
    """Bytes per second each rank can push out and take in (each direction of its NICs)."""

    out_Bps: np.ndarray
    in_Bps: np.ndarray

    def __post_init__(self) -> None:
        o = np.asarray(self.out_Bps, dtype=np.float64).reshape(-1)
        i = np.asarray(self.in_Bps, dtype=np.float64).reshape(-1)
        if o.shape != i.shape or o.size == 0:
            raise UserError("bandwidth table: in and out need one positive value per rank")
        if not (np.all(np.isfinite(o)) and np.all(np.isfinite(i)) and o.min() > 0 and i.min() > 0):
            raise UserError("bandwidth table: every rank needs a positive, finite in and out bandwidth "
                            "(a rank with no rails left cannot take part; drop it from the group)")
        object.__setattr__(self, "out_Bps", o)
        object.__setattr__(self, "in_Bps", i)

    @classmethod
    def uniform(cls, p: int, Bps: float) -> "Bandwidth":
        return cls(np.full(p, float(Bps)), np.full(p, float(Bps)))

    @classmethod
    def degraded(cls, p: int, Bps: float, betas: Mapping[int, float] | Sequence[float]) -> "Bandwidth":
        """Every rank at ``Bps`` except those given a fraction beta (a dict rank->beta or p values)."""
        f = np.ones(p)
        if isinstance(betas, Mapping):
            for r, b in betas.items():
                if not 0 <= r < p:
                    raise UserError(f"degraded rank {r} outside a group of {p}")
                f[r] = b
        else:
            f = np.asarray(betas, dtype=np.float64)
            if f.size != p:
                raise UserError(f"need {p} bandwidth fractions, got {f.size}")
        return cls(f * Bps, f * Bps)

    @property
    def p(self) -> int:
        return self.out_Bps.size

    @property
    def link_Bps(self) -> np.ndarray:
        """Per rank, the smaller direction: schedules here send and receive equal amounts per rank."""
        return np.minimum(self.out_Bps, self.in_Bps)

    @property
    def reference_Bps(self) -> float:
        """B of the formulas: the best rank's capacity."""
        return float(self.link_Bps.max())

    @property
    def betas(self) -> np.ndarray:
        return self.link_Bps / self.reference_Bps

    def classes(self) -> list[list[int]]:
        """Ranks grouped by equal (out, in), healthy-looking (largest) groups first."""
        keys: dict[tuple[float, float], list[int]] = {}
        for r, k in enumerate(zip(self.out_Bps.tolist(), self.in_Bps.tolist())):
            keys.setdefault(k, []).append(r)
        return sorted(keys.values(), key=lambda g: (-min(self.link_Bps[g]), g[0]))

    def quantized(self, steps: int = 32) -> "Bandwidth":
        """Round fractions of the best rank to 1/steps (never to zero), so every rank plans alike
        from slightly different measurements and noise does not trigger re-planning."""
        ref = self.reference_Bps
        q = lambda x: np.maximum(np.round(x / ref * steps), 1) / steps * ref  # noqa: E731
        return Bandwidth(q(self.out_Bps), q(self.in_Bps))

    def key(self) -> tuple:
        return tuple(self.out_Bps.tolist()) + tuple(self.in_Bps.tolist())
