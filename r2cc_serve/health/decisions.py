"""Operator decisions (drains and failovers made through the admin API), kept per group and host.

The control agent records a decision when a drain or failover succeeds and clears it on
undrain or restore; the rail monitor shows the decisions beside each rail; a new agent for the
same group on the same host applies them again at start. With a state directory
(R2CC_STATE_DIR) they live in `<dir>/<group>@<host>.json` and survive restarts; without one
they are kept in memory only.

The file (0600, in a 0700 directory, replaced atomically; every rank of the host may write it,
so each change re-reads it under a lock and merges):

    {"format": "r2cc-decisions/1", "group": "tp:0", "host": "node0", "updated": 1764150000.0,
     "rails": {"1": {"drain": {"reason": "swap cable", "by": "1a2b3c4d", "at": 1764150000.0}}}}

`by` is a fingerprint of the admin token (never the token); `at` is unix seconds.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import threading
import time

log = logging.getLogger("r2cc_serve.health")

FORMAT = "r2cc-decisions/1"
KINDS = ("drain", "failover")                          # decisions that hold until ended
ENDED_BY = {"drain": "undrain", "failover": "restore"}
CLEARS = {end: kind for kind, end in ENDED_BY.items()}
REASON_MAX_CHARS = 200
BY_MAX_CHARS = 64
# Plain text on one line: no control characters (C0, DEL, C1) and no line separators, so a
# reason cannot forge log lines or break the table it is shown in.
PLAIN_TEXT_PATTERN = r"^[^\x00-\x1f\x7f-\x9f\u2028\u2029]*$"
_PLAIN = re.compile(PLAIN_TEXT_PATTERN)


def check_text(value, limit: int, what: str) -> str | None:
    """value if it is plain text of at most `limit` characters (None and "" give None); else ValueError."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > limit or not _PLAIN.match(value):
        raise ValueError(f"{what} must be plain text on one line of at most {limit} characters")
    return value


def state_path(state_dir: str, group: str, host: str) -> str:
    safe = lambda s: re.sub(r"[^A-Za-z0-9._-]", "_", s)  # noqa: E731
    return os.path.join(state_dir, f"{safe(group)}@{safe(host)}.json")


def describe(rail: int, kind: str, d: dict) -> str:
    """One line for logs and tables: 'rail1 drain by 1a2b3c4d at 2026-11-26 10:00:00 UTC: swap cable'."""
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(d["at"]))
    why = f": {d['reason']}" if d["reason"] else ""
    return f"rail{rail} {kind} by {d['by'] or 'an unknown caller'} at {at}{why}"


class DecisionStore:
    """The decisions of one group on one host: {rail: {kind: {reason, by, at}}}."""

    def __init__(self, state_dir: str | None, group: str, host: str):
        self.group, self.host = group, host
        self.path = state_path(state_dir, group, host) if state_dir else None
        self._lock = threading.Lock()
        self._rails: dict[int, dict[str, dict]] = {}
        self.version = 0  # counts changes: the monitor re-samples when it moves
        if self.path:
            try:
                os.makedirs(state_dir, mode=0o700, exist_ok=True)
                if os.stat(state_dir).st_uid == os.getuid():
                    os.chmod(state_dir, 0o700)  # operators' reasons and token fingerprints: owner only
            except OSError as exc:  # serving matters more than remembering: keep decisions in memory
                log.error("r2cc: cannot use R2CC_STATE_DIR=%s (%s); operator decisions of %s on %s are not "
                          "kept across restarts. Make the directory writable or point R2CC_STATE_DIR elsewhere",
                          state_dir, exc.strerror or exc, group, host)
                self.path = None
        if self.path:
            self._rails = self._read()

    def by_rail(self) -> dict[int, dict[str, dict]]:
        with self._lock:
            return {r: {k: dict(d) for k, d in kinds.items()} for r, kinds in self._rails.items()}

    def record(self, rail: int, kind: str, reason: str | None, by: str | None) -> None:
        """Note a drain or failover of `rail` (replacing an earlier one of the same kind). OSError
        when the file cannot be written (the decision is then kept in memory only)."""
        entry = {"reason": reason or None, "by": by or "", "at": time.time()}

        def note(rails):
            rails.setdefault(rail, {})[kind] = entry

        self._change(note)

    def clear(self, rail: int, kind: str) -> None:
        """Forget the `kind` decision of `rail` (an undrain or restore). OSError as for record."""

        def drop(rails):
            kinds = rails.get(rail, {})
            kinds.pop(kind, None)
            if not kinds:
                rails.pop(rail, None)

        self._change(drop)

    # ---- the file ---------------------------------------------------------------

    def _change(self, edit) -> None:
        with self._lock:
            self.version += 1
            if not self.path:
                edit(self._rails)
                return
            try:
                fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
                with os.fdopen(fd) as lock:  # the other ranks of this host write the same file
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    rails = self._read(quiet=True)
                    edit(rails)
                    self._write(rails)
            except OSError:
                edit(self._rails)  # shown while this process lives; the caller reports the failure
                raise
            self._rails = rails  # also what the host's other ranks recorded

    def _read(self, quiet: bool = False) -> dict[int, dict[str, dict]]:
        try:
            with open(self.path) as f:
                doc = json.load(f)
            return self._parse(doc)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            if not quiet:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                log.error("r2cc: cannot use the operator decisions in %s (%s); starting with no drains or "
                          "failovers from it. Fix or remove the file (the next drain or failover through the "
                          "admin API rewrites it), then re-apply decisions you still want", self.path, why)
            return {}

    def _parse(self, doc) -> dict[int, dict[str, dict]]:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("rails"), dict):
            raise ValueError(f"not an {FORMAT} document")
        if (doc.get("group"), doc.get("host")) != (self.group, self.host):
            raise ValueError(f"it belongs to group {doc.get('group')!r} on host {doc.get('host')!r}")
        out = {}
        for rail, kinds in doc["rails"].items():
            if not rail.isdigit() or not isinstance(kinds, dict) or not set(kinds) <= set(KINDS):
                raise ValueError(f"bad entry for rail {rail!r}")
            for d in kinds.values():
                if not (isinstance(d, dict) and isinstance(d.get("at"), (int, float))):
                    raise ValueError(f"bad entry for rail {rail}")
                d["reason"] = check_text(d.get("reason"), REASON_MAX_CHARS, "reason")
                d["by"] = check_text(d.get("by"), BY_MAX_CHARS, "by") or ""
            out[int(rail)] = {k: {"reason": d["reason"], "by": d["by"], "at": float(d["at"])} for k, d in kinds.items()}
        return out

    def _write(self, rails: dict) -> None:
        doc = {"format": FORMAT, "group": self.group, "host": self.host, "updated": time.time(),
               "rails": {str(r): kinds for r, kinds in sorted(rails.items())}}
        tmp = f"{self.path}.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1)
                f.flush()
                os.fsync(f.fileno())  # a decision must survive the crash that may follow it
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
