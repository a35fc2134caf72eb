"""A process whose group aborted exits as it means to (issue 49, item 4): its own exit code, no
std::terminate ("terminate called without an active exception", exit -6), no hang. Each rank is a
process of its own (exit_workers.py), with and without comm.close() before it exits. Loopback, no root.
"""

from __future__ import annotations

import datetime
import os
import pathlib
import subprocess
import sys

import pytest

from tests.comm import exit_workers

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXIT_WITHIN_S = 90  # start, connect, abort and exit, on a busy 2-core box


def _run_pair(kind: str, how: str, tmp_path) -> list[subprocess.CompletedProcess]:
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60))
    env = dict(os.environ, PYTHONPATH=str(ROOT), R2CC_STATUS_DIR=str(tmp_path))
    # The defaults: the control plane on, its rail monitor (a daemon thread) in the transport's
    # wait_state_change up to 1 s at a time; one back from there while the interpreter finalized
    # ended the process by std::terminate.
    for knob in ("R2CC_CONTROL", "R2CC_STATUS_REFRESH_MS"):
        env.pop(knob, None)
    procs = [subprocess.Popen([sys.executable, "-m", "tests.comm.exit_workers", str(rank), str(store.port), kind, how],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(2)]
    done = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=EXIT_WITHIN_S)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return done


@pytest.mark.parametrize("kind,how", [(k, h) for k in exit_workers.KINDS for h in ("close", "exit")] +
                         [("timeout", "busy")])
def test_an_aborted_rank_exits_with_its_own_code(kind, how, tmp_path):
    r0, r1 = _run_pair(kind, how, tmp_path)
    for rank, r in enumerate((r0, r1)):
        assert "terminate called" not in r.stderr, (rank, r.stderr[-3000:])
    if kind == "timeout":
        assert "rank 1 raised CollectiveTimeoutError" in r1.stdout, (r1.stdout, r1.stderr[-3000:])
        assert "rank 0 raised" in r0.stdout and r0.returncode == 3, (r0.returncode, r0.stdout, r0.stderr[-3000:])
    else:
        assert r0.returncode == -9, (r0.returncode, r0.stderr[-3000:])  # the victim
        assert "rank 1 raised PeerGoneError" in r1.stdout, (r1.stdout, r1.stderr[-3000:])
    assert r1.returncode == 3, (r1.returncode, r1.stderr[-3000:])


CONNECT_AFTER_CLOSE = """
from r2cc_serve import _C
t = _C.Transport(0, 1, ["127.0.0.1"], "", b"s" * 16, 1, _C.TransportOptions())
t.close()
try:
    t.connect_all([[("127.0.0.1", t.listen_ports()[0])]])
except _C.AbortedError as exc:
    print("raised", exc.kind)
del t
"""


def test_connect_all_after_close_starts_no_thread():
    # Its threads started and were never joined: the transport's destructor ended the process.
    r = subprocess.run([sys.executable, "-c", CONNECT_AFTER_CLOSE], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                       capture_output=True, text=True, timeout=EXIT_WITHIN_S)
    assert r.returncode == 0 and "terminate called" not in r.stderr, (r.returncode, r.stderr[-3000:])
    assert r.stdout.split() == ["raised", "closed"], r.stdout
