"""How a time span is printed in every report and table: seconds in, text out, "-" for unknown."""

from __future__ import annotations


def seconds(x: float | None, digits: int = 2) -> str:
    """'1.25 s'"""
    return "-" if x is None else f"{x:.{digits}f} s"


def millis(x: float | None, digits: int = 0, unit: bool = True) -> str:
    """'125 ms' (unit=False: '125', for a column whose header names the unit)."""
    if x is None:
        return "-"
    return f"{x * 1000:.{digits}f}" + (" ms" if unit else "")
