"""Is the process that wrote a status file still the one running? (pid + start time)

A rank killed by SIGKILL cannot remove its `<group>-rank<r>.json`; readers use this to
recognise such leftovers instead of calling a dead agent forever. The start time guards
against a new process that was given the same pid.
"""

from __future__ import annotations

import os

from r2cc_serve.util.procfs import read_stat


def _start_ticks(pid: int) -> int | None:
    st = read_stat(pid)
    return None if st is None else st.start_ticks


def process_identity() -> dict:
    pid = os.getpid()
    return {"pid": pid, "start": _start_ticks(pid)}


def process_alive(identity: dict | None) -> bool:
    """False only when sure the process is gone; a file without an identity counts as alive."""
    if not isinstance(identity, dict) or not isinstance(identity.get("pid"), int):
        return True
    start = _start_ticks(identity["pid"])
    return start is not None and (identity.get("start") is None or start == identity["start"])
