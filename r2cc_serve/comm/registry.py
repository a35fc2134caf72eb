"""The communicators alive in this process, by group name (for health, admin and metrics)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

_lock = threading.Lock()
_groups: dict[str, "Entry"] = {}


@dataclass
class Entry:
    group: str
    global_rank: int
    node: int
    comm: object  # r2cc_serve.Communicator


def register(group: str, global_rank: int, node: int, comm) -> None:
    with _lock:
        _groups[group] = Entry(group, global_rank, node, comm)


def unregister(group: str) -> None:
    with _lock:
        _groups.pop(group, None)


def entries() -> list[Entry]:
    with _lock:
        return list(_groups.values())
