"""Is the process that wrote a status file still the one running? (pid + start time)

A rank killed by SIGKILL cannot remove its `<group>-rank<r>.json`; readers use this to
recognise such leftovers instead of calling a dead agent forever. The start time guards
against a new process that was given the same pid.
"""

from __future__ import annotations

import os


def _start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # Field 22 (starttime); the command name (field 2) may hold spaces, so split after its ')'.
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[19])


def process_identity() -> dict:
    pid = os.getpid()
    return {"pid": pid, "start": _start_ticks(pid)}


def process_alive(identity: dict | None) -> bool:
    """False only when sure the process is gone; a file without an identity counts as alive."""
    if not isinstance(identity, dict) or not isinstance(identity.get("pid"), int):
        return True
    start = _start_ticks(identity["pid"])
    return start is not None and (identity.get("start") is None or start == identity["start"])
