"""Where the guest's build lives, and the content keys that make a second build a no-op.

Each artifact is a directory `<cache>/<name>-<key>` holding a `.key` file written last: a
directory with the right key is complete (an interrupted build leaves none). Keys hash the
inputs, so a changed input names a new directory and an old one is never trusted.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import os
import shutil

from r2cc_serve import envs

KEY_FILE = ".key"


def root() -> str:
    return envs.get("R2CC_GUEST_CACHE")


def digest(*parts: str | bytes) -> str:
    """A short hex key of the parts (each length-prefixed, so ("ab", "c") != ("a", "bc"))."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:16]


def file_digest(paths: list[str], base: str) -> str:
    """Key of files' names (relative to base) and contents, in a stable order."""
    parts: list[str | bytes] = []
    for path in sorted(paths):
        parts.append(os.path.relpath(path, base))
        with open(path, "rb") as f:
            parts.append(f.read())
    return digest(*parts)


def is_fresh(path: str, key: str) -> bool:
    try:
        with open(os.path.join(path, KEY_FILE)) as f:
            return f.read().strip() == key
    except OSError:
        return False


def mark_fresh(path: str, key: str) -> None:
    """Record the directory as complete for key (the last step of its build)."""
    with open(os.path.join(path, KEY_FILE), "w") as f:
        f.write(key + "\n")


def fresh_dir(name: str, key: str) -> str:
    """A clean directory `<cache>/<name>-<key>` to build into (anything half-built there is removed)."""
    path = os.path.join(root(), f"{name}-{key}")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def prune(name: str, keep: str, spare: int = 2) -> None:
    """Remove `<name>-*` directories but `keep` and the `spare` most recently used others."""
    others = [p for p in glob.glob(os.path.join(root(), f"{name}-*")) if os.path.basename(p) != f"{name}-{keep}"]
    others.sort(key=os.path.getmtime, reverse=True)
    for path in others[spare:]:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def locked(progress=None):
    """One build at a time per cache (two test runs, or two checkouts, may build at once)."""
    os.makedirs(root(), exist_ok=True)
    with open(os.path.join(root(), ".lock"), "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                progress(f"waiting for another build of the guest in {root()} to finish")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
