"""`r2cc doctor --lab`: the doctor on every host of the fault lab that is up.

Part of the test bed (tests/test_import_layers.py files it there): r2cc_serve/cli.py hands it
to `r2cc doctor` as the --lab action, so the doctor that ships to a fleet never imports the lab.
It does what a user does on real servers: `r2cc doctor --serve` inside every lab host, then
`r2cc doctor --rails ... --peer ...` inside each host in turn, one at a time so that one host's
bandwidth probes do not share the CPU with another's.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Iterator

from r2cc_serve.errors import UserError
from r2cc_testbed import child_pythonpath
from r2cc_testbed.lab import Lab

READY_S = 20.0      # a responder prints its "serving" line within this (a busy host starts Python slowly)
CHECK_S = 120.0     # one host's checks end well within this (every wait in them has a timeout)


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = child_pythonpath(env.get("PYTHONPATH"))
    return env


def doctor_argv(lab: Lab, host: int, *args: str) -> list[str]:
    """`r2cc doctor ARGS` inside lab host `host`, with the lab's rails (the lean entry point:
    four of them start in a run, on a busy 2-core box)."""
    rails = ",".join(lab.rail_ifname(k) for k in range(lab.rails))
    return ["ip", "netns", "exec", lab.host_ns(host), sys.executable, "-m", "r2cc_serve.doctor",
            "--rails", rails, *args]


def peer_args(lab: Lab, host: int) -> list[str]:
    """--peer ADDRS for every other host of the lab."""
    out = []
    for j in range(lab.hosts):
        if j != host:
            out += ["--peer", ",".join(lab.rail_ip(j, k) for k in range(lab.rails))]
    return out


@contextlib.contextmanager
def responders(lab: Lab, port: int, hosts: list[int] | None = None) -> Iterator[dict[int, subprocess.Popen]]:
    """`r2cc doctor --serve` in each of `hosts` (default: all), listening when the block starts;
    stopped at its end."""
    procs: dict[int, subprocess.Popen] = {}
    try:
        for i in range(lab.hosts) if hosts is None else hosts:
            procs[i] = subprocess.Popen(doctor_argv(lab, i, "--serve", "--port", str(port)), env=_env(),
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        start_new_session=True)
        for i, proc in procs.items():
            _wait_ready(lab.host_ns(i), proc)
        yield procs
    finally:
        for proc in procs.values():
            stop(proc)


def _wait_ready(ns: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_S
    while (left := deadline - time.monotonic()) > 0:
        if select.select([proc.stdout], [], [], left)[0]:
            line = proc.stdout.readline()
            if "serving on" in line:
                return
            if not line:  # it ended: say why in its own words
                err = proc.stderr.read().strip().splitlines()
                raise UserError(f"the responder in {ns} did not start: {err[-1] if err else 'no message'}")
    raise UserError(f"the responder in {ns} did not listen within {READY_S:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the responder's process group (the CLI unwinds on it), SIGKILL if it lingers."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(3)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(3)
    for stream in (proc.stdout, proc.stderr):
        if stream:
            stream.close()


def check_from(lab: Lab, host: int, *args: str) -> subprocess.CompletedProcess:
    """The checks from lab host `host` against every other host."""
    argv = doctor_argv(lab, host, *peer_args(lab, host), *args)
    try:
        return subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=CHECK_S)
    except subprocess.TimeoutExpired:
        raise UserError(f"r2cc doctor in {lab.host_ns(host)} did not finish within {CHECK_S:.0f} s") from None


def run(args) -> int:
    lab = Lab.load()
    started = time.monotonic()
    extra = ["--port", str(args.port), "--bandwidth-seconds", str(args.bandwidth_seconds)]
    extra += ["--json"] if args.json else []
    worst, reports = 0, []
    with responders(lab, args.port):
        for i in range(lab.hosts):
            proc = check_from(lab, i, *extra)
            if proc.returncode not in (0, 1):  # bad input or a crash: its message is the answer
                raise UserError(f"r2cc doctor in {lab.host_ns(i)} failed: "
                                f"{(proc.stderr.strip().splitlines() or ['no message'])[-1]}")
            worst = max(worst, proc.returncode)
            if args.json:
                reports.append(json.loads(proc.stdout))
            else:
                print(f"=== from {lab.host_ns(i)} ===\n{proc.stdout.rstrip()}\n", flush=True)
    took = time.monotonic() - started
    if args.json:
        print(json.dumps({"hosts": reports, "seconds": round(took, 3), "exit": worst}, indent=2))
    else:
        print(f"r2cc doctor --lab: {lab.hosts} hosts x {lab.rails} rails, {took:.1f} s, exit {worst}")
    return worst
