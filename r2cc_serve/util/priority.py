"""Higher CPU priority for the few threads that must answer while the workers keep every core busy.

On a 2-core box serving vLLM, a nice-0 thread waited p99 ~300 ms and up to ~1 s for a CPU
(measured from run_delay in /proc/thread-self/schedstat). Two parts of r2cc must not:
  - vLLM's API server with the r2cc backend (admin reads, /health): GET p99 18-27 ms at nice 0,
    9-11 ms at nice -10 (R2CC_API_SERVER_NICE);
  - each rank's control agent and rail monitor (R2CC_CONTROL_NICE): an operator's drain waits
    for every rank's agent to answer.
Both use little CPU, so the model loses almost nothing. Linux keeps nice per thread and a new
thread inherits its creator's, so raising the creating thread covers the threads it starts.
"""

from __future__ import annotations

import os

_NO_PERMISSION = ("not changed: nice {nice} needs root or CAP_SYS_NICE (replies may then wait for a CPU on a "
                  "busy host; set the knob to 0 to silence this)")


def _raise(tid: int, nice: int) -> bool:
    """True if thread tid was raised to `nice` (False: it already ran at that priority or higher)."""
    if os.getpriority(os.PRIO_PROCESS, tid) <= nice:
        return False
    os.setpriority(os.PRIO_PROCESS, tid, nice)
    return True


def raise_thread_priority(nice: int) -> str:
    """Set the calling thread (and so the threads it starts later) to `nice`; returns what happened."""
    if nice == 0:
        return "left as is (nice 0)"
    try:
        return f"nice {nice}" if _raise(0, nice) else f"already at nice {os.getpriority(os.PRIO_PROCESS, 0)}"
    except PermissionError:
        return _NO_PERMISSION.format(nice=nice)


def raise_process_priority(nice: int) -> str:
    """Set every current thread of this process to `nice` unless it already runs at that priority
    or higher (threads made later inherit it from their creator). Returns what happened."""
    if nice == 0:
        return "left as is (R2CC_API_SERVER_NICE=0)"
    changed = 0
    for tid in (int(t) for t in os.listdir("/proc/self/task")):
        try:
            changed += _raise(tid, nice)
        except ProcessLookupError:
            continue  # the thread ended meanwhile
        except PermissionError:
            return _NO_PERMISSION.format(nice=nice)
    return f"nice {nice} on {changed} thread(s)"
