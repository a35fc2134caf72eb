"""The one percentile of the project (load tests, serving benchmarks, the admin probe)."""

from __future__ import annotations

import math
from typing import Iterable


def percentile(values: Iterable[float | None], p: float) -> float | None:
    """Linear interpolation between the closest ranks, numpy's default and the method of
    `vllm bench serve`, so our figures and vLLM's agree; None values are skipped, and an
    empty input gives None."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    k = (len(xs) - 1) * p / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (k - lo))
