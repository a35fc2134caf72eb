"""The lab's state file: what was built and which faults are active.

Writes are atomic (temp file + rename) and read-modify-write cycles hold an flock, so a
background flap thread and a CLI `fault` command cannot lose each other's updates.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from typing import Iterator

from r2cc_serve import envs
from r2cc_testbed.lab.netns import LabError


def state_path() -> str:
    """R2CC_LAB_STATE if set; else one file per prefix, so labs of different prefixes never
    read each other's state (the default prefix keeps the historical name)."""
    if "R2CC_LAB_STATE" in os.environ:
        return envs.get("R2CC_LAB_STATE")
    prefix = envs.get("R2CC_LAB_PREFIX")
    default = envs.get("R2CC_LAB_STATE")
    if prefix == "r2cc":
        return default
    return os.path.join(os.path.dirname(default), f"{prefix}-state.json")


def read(path: str | None = None) -> dict | None:
    """The recorded lab, or None if no state file exists."""
    path = path or state_path()
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise LabError(f"cannot read lab state {path}: {exc}; run `r2cc lab down` to reset") from exc


def write(state: dict, path: str | None = None) -> None:
    path = path or state_path()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=2, sort_keys=True)
    os.replace(tmp, path)


def remove(path: str | None = None) -> None:
    path = path or state_path()
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


@contextlib.contextmanager
def locked(path: str | None = None) -> Iterator[None]:
    """Hold the lab's lock (a sibling .lock file) for a read-modify-write of the state."""
    path = path or state_path()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# --- active faults: state["faults"]["<host>/<rail>"] = {"down": True, "degrade": "10mbit", ...} ---

def _key(host: int, rail: int) -> str:
    return f"{host}/{rail}"


def is_current(lab_id: str, path: str | None = None) -> bool:
    """Is the lab with this id still the one the state file describes?"""
    state = read(path)
    return state is not None and state.get("id") == lab_id


def set_fault(host: int, rail: int, kind: str, value=True, *, lab_id: str,
              path: str | None = None) -> None:
    with locked(path):
        state = read(path)
        if state is None or state.get("id") != lab_id:
            return  # that lab was torn down meanwhile (e.g. during a background flap)
        state.setdefault("faults", {}).setdefault(_key(host, rail), {})[kind] = value
        write(state, path)


def clear_fault(host: int, rail: int, kinds: tuple[str, ...] | None = None, *, lab_id: str,
                path: str | None = None) -> None:
    """Forget the given fault kinds (all if kinds is None) on host/rail."""
    with locked(path):
        state = read(path)
        if state is None or state.get("id") != lab_id:
            return
        faults = state.setdefault("faults", {})
        entry = faults.get(_key(host, rail), {})
        for kind in list(entry) if kinds is None else kinds:
            entry.pop(kind, None)
        if not entry:
            faults.pop(_key(host, rail), None)
        write(state, path)


def fault_list(state: dict) -> list[dict]:
    """Active faults as a flat, sorted list of {host, rail, kind, arg}."""
    out = []
    for key, entry in state.get("faults", {}).items():
        host, rail = (int(x) for x in key.split("/"))
        for kind, value in entry.items():
            out.append({"host": host, "rail": rail, "kind": kind,
                        "arg": None if value is True else value})
    return sorted(out, key=lambda f: (f["host"], f["rail"], f["kind"]))
