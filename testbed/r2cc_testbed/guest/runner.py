"""Boot the guest, run one command in it, power off: `run(command, rails=N, timeout_s=...)`.

Every wait has a deadline: the boot (until the command starts), the command (its timeout, which
the guest enforces too, plus a grace), the power-off. A guest past one is killed and the result
says where it hung; a run never hangs its caller.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from r2cc_testbed.guest import job, qemu
from r2cc_testbed.guest.builder import Build, build as build_guest

MARK = "r2cc-guest:"  # guest_init.sh's lines for the host
_ANSI = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|c)")  # the firmware's terminal resets and colours
BOOT_TIMEOUT_S = 300.0
GRACE_S = 30.0  # past the command's timeout: the guest's own `timeout -k 5` acts first
POWEROFF_TIMEOUT_S = 60.0
_HUNG = {"boot": "the guest did not start the command", "command": "the command did not end",
         "power-off": "the guest did not power off"}


@dataclass
class GuestResult:
    rc: int | None  # the command's exit code; None if it never ended
    output: str  # the command's stdout and stderr
    console: str  # everything the guest printed (kernel, init, command)
    out_dir: str  # the share: what the command wrote to $R2CC_GUEST_OUT
    boot_s: float | None  # qemu start to the command's start (kernel, init, modules, rails)
    up_s: float | None  # qemu start to the guest's own init (kernel and initramfs): part of boot_s
    command_s: float | None
    total_s: float
    problem: str | None = None  # what went wrong outside the command (a hang, a crash), else None

    @property
    def ok(self) -> bool:
        return self.rc == 0 and self.problem is None

    @property
    def timed_out(self) -> bool:
        return self.rc in (124, 137)  # timeout(1): TERM, then KILL

    def summary(self) -> str:
        times = f"boot {_s(self.boot_s)}, command {_s(self.command_s)}, total {self.total_s:.1f} s"
        return f"guest: rc={self.rc} ({times})" + (f": {self.problem}" if self.problem else "")


def _s(t: float | None) -> str:
    return "-" if t is None else f"{t:.1f} s"


def run(command: str | Sequence[str], rails: int = 2, timeout_s: float = 600.0, *, out_dir: str | None = None,
        on_line: Callable[[str], None] | None = None, boot_timeout_s: float = BOOT_TIMEOUT_S,
        build: Build | None = None, checkout: str | None = None) -> GuestResult:
    """Run command (a shell string or an argv) in a fresh guest with `rails` rails.

    It runs in the checkout with PYTHONPATH=checkout:checkout/testbed, the portable core in place,
    and the rails' map in R2CC_GUEST_* (topology.env). on_line gets every console line as it comes.
    """
    b = build or build_guest(checkout)
    out_dir = out_dir or tempfile.mkdtemp(prefix="r2cc-guest-")
    jobdir = job.write(out_dir, b, command, rails, timeout_s)
    argv = qemu.argv(b.qemu, b.kernel.vmlinux, b.initramfs, out_dir)
    watch = _Console(argv, on_line)
    try:
        problem = watch.follow(boot_timeout_s, timeout_s + GRACE_S, POWEROFF_TIMEOUT_S)
    finally:
        watch.kill()
    rc = _read_int(os.path.join(jobdir, "rc"))
    if problem is None and "rails failed" in watch.at:
        problem = "setting up the rails failed (the console shows why); the command did not run"
    if rc is None and problem is None:
        problem = "the guest powered off before the command ended (see the console)"
    return GuestResult(rc=rc, output=_read(os.path.join(jobdir, "output.log")), console="\n".join(watch.lines),
                       out_dir=out_dir, boot_s=watch.span("start", "command start"), up_s=watch.span("start", "up"),
                       command_s=watch.span("command start", "command end"), total_s=watch.span("start", "exit") or 0.0,
                       problem=problem)


def shell(rails: int = 2, *, build: Build | None = None, checkout: str | None = None) -> int:
    """An interactive shell in the guest on this terminal (rails and env as for run); exit powers off."""
    b = build or build_guest(checkout)
    out_dir = tempfile.mkdtemp(prefix="r2cc-guest-shell-")
    try:
        job.write(out_dir, b, "true", rails, timeout_s=1)
        return subprocess.call(qemu.argv(b.qemu, b.kernel.vmlinux, b.initramfs, out_dir, shell=True))
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


class _Console:
    """qemu's serial console, read line by line on a thread; marks when guest_init.sh's lines came."""

    def __init__(self, argv: list[str], on_line: Callable[[str], None] | None):
        self.lines: list[str] = []
        self.at: dict[str, float] = {"start": time.monotonic()}
        self._on_line = on_line
        self._q: queue.Queue[str | None] = queue.Queue()
        # Own session: killing qemu's group takes nothing else with it.
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self._q.put(_ANSI.sub("", raw.decode(errors="replace").rstrip("\r\n")).replace("\r", ""))
        self._q.put(None)

    def follow(self, boot_s: float, command_s: float, poweroff_s: float) -> str | None:
        """Read until qemu exits; None, or why it was stopped (the caller kills it)."""
        phase, deadline = "boot", time.monotonic() + boot_s
        while True:
            try:
                line = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                limit = {"boot": boot_s, "command": command_s, "power-off": poweroff_s}[phase]
                return f"hung: {_HUNG[phase]} within {limit:g} s; killed"
            if line is None:
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    return "hung: qemu closed its console but did not exit within 30 s; killed"
                self.at["exit"] = time.monotonic()
                return None
            self.lines.append(line)
            if self._on_line:
                self._on_line(line)
            # The mark may follow the firmware's last words on the same line ("Booting from ROM..").
            said = line[line.index(MARK) + len(MARK):].strip() if MARK in line else ""
            if said.startswith("up "):
                self.at["up"] = time.monotonic()
            elif said.startswith("command start"):
                self.at["command start"] = time.monotonic()
                phase, deadline = "command", time.monotonic() + command_s
            elif said.startswith("rails failed"):
                self.at["rails failed"] = time.monotonic()
                phase, deadline = "power-off", time.monotonic() + poweroff_s
            elif said.startswith("command end"):
                self.at["command end"] = time.monotonic()
                phase, deadline = "power-off", time.monotonic() + poweroff_s

    def span(self, first: str, last: str) -> float | None:
        if first in self.at and last in self.at:
            return self.at[last] - self.at[first]
        return None

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)
        self.at.setdefault("exit", time.monotonic())


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _read_int(path: str) -> int | None:
    text = _read(path).strip()
    return int(text) if text.lstrip("-").isdigit() else None
