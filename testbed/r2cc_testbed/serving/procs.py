"""Processes of a deployment: each in its own session, with a log file, stopped for sure.

vLLM starts EngineCore, workers and a resource tracker with `spawn`; they stay in the
session of the `vllm serve` we start with start_new_session=True. Stopping therefore means:
SIGTERM to the leader (vLLM's own shutdown), a grace period, then SIGKILL to every process
whose session id is ours (a process group kill misses anything that changed its group).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import deque

from r2cc_serve.util import procfs

# Runs the command in a private mount namespace with its own tmpfs on /dev/shm: what one
# machine sees as /dev/shm is private to it (lab namespaces otherwise share the host's),
# and whatever vLLM leaves there vanishes with the last process of the node.
PRIVATE_SHM = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               'mount -t tmpfs -o size=2g,mode=1777 r2cc-serve-shm /dev/shm && exec "$@"', "r2cc-node"]


class Proc:
    """One started command (a vLLM node), its log, and its session id."""

    def __init__(self, name: str, argv: list[str], env: dict, log_path: str):
        self.name, self.argv, self.log_path = name, argv, log_path
        self._log = open(log_path, "ab", buffering=0)
        self.popen = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        self.sid = self.popen.pid  # session leader: sid == pid

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)

    def terminate(self) -> None:
        """SIGTERM to the leader only: vLLM's API server then stops its engine and workers."""
        if self.alive():
            try:
                self.popen.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def kill_session(self) -> list[int]:
        """SIGKILL every process of our session (leader included); returns the pids hit."""
        hit = session_pids(self.sid)
        for pid in hit:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return hit

    def close(self) -> None:
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()


def stop_all(procs: list[Proc], grace_s: float = 10.0) -> list[str]:
    """SIGTERM every leader, wait up to grace_s for the sessions to empty, SIGKILL the rest.

    Returns what is still alive afterwards (should be empty), as "name: pid cmd" strings.
    """
    for p in procs:
        p.terminate()
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(session_pids(p.sid) for p in procs):
        time.sleep(0.2)
    for p in procs:
        p.kill_session()
    deadline = time.monotonic() + 10.0  # SIGKILL is quick unless a process is in D state
    while time.monotonic() < deadline and any(session_pids(p.sid) for p in procs):
        time.sleep(0.1)
    for p in procs:
        p.close()
    return [f"{p.name}: {pid} {_cmdline(pid)}" for p in procs for pid in session_pids(p.sid)]


def session_pids(sid: int) -> list[int]:
    """Pids of live (non-zombie) processes whose session id is sid."""
    return [st.pid for st in procfs.all_stats() if st.session == sid and st.state != "Z"]


def sessions_cpu_s(sids: list[int]) -> float:
    """User + system CPU seconds, so far, of the live processes of these sessions (a process
    that exits takes its share with it: compare before/after over a window where none should)."""
    return sum(st.cpu_s for st in procfs.all_stats() if st.session in sids)


def log_tail(path: str, lines: int = 30) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(deque(f, maxlen=lines))
    except OSError as exc:
        return f"(no log: {exc})"


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"
