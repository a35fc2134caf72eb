"""/proc/<pid>/stat, read in one place: the fields after the command name, by name."""

from __future__ import annotations

import os
from dataclasses import dataclass

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str        # R, S, D, Z, ...
    session: int
    utime_ticks: int
    stime_ticks: int
    start_ticks: int  # since boot: with the pid, names one process for its whole life

    @property
    def cpu_s(self) -> float:
        return (self.utime_ticks + self.stime_ticks) / CLOCK_TICKS


def read_stat(pid: int | str) -> ProcStat | None:
    """The process's stat line, parsed; None if it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    # Then: state(3) ppid pgrp session(6) tty tpgid flags minflt cminflt majflt cmajflt
    # utime(14) stime(15) cutime cstime priority nice threads itrealvalue starttime(22).
    fields = text[text.rindex(")") + 2:].split()
    try:
        return ProcStat(pid=int(pid), state=fields[0], session=int(fields[3]), utime_ticks=int(fields[11]),
                        stime_ticks=int(fields[12]), start_ticks=int(fields[19]))
    except (IndexError, ValueError):
        return None


def all_stats() -> list[ProcStat]:
    """Every process's stat that could be read right now."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := read_stat(entry)) is not None:
            out.append(st)
    return out
