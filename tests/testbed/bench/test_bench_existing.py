"""`r2cc bench --no-lab` (servers that already exist): argument checks, a missing peer, and two
ranks started by hand on loopback, as two servers would run them. No root."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.testbed.bench.two_ranks import run_two

MAIN = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
RAILS = "127.0.0.1,127.0.0.2"  # loopback rails, as tests/comm/workers.py names them


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "r2cc_serve.cli", "bench", *args]


def env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (MAIN, e.get("PYTHONPATH")) if p)
    e.pop("R2CC_RAILS", None)
    e.pop("R2CC_CONFIG", None)
    e.pop("R2CC_NETNS", None)
    return e


def bench(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd(*args), cwd=MAIN, env=env(), capture_output=True, text=True, timeout=timeout)


BASE = ("--no-lab", "--world", "2", "--rails", RAILS)


@pytest.mark.parametrize("args, words", [
    (("--no-lab",), "needs --rank, --world and --master"),
    (("--no-lab", "--rank", "2", "--world", "2", "--master", "h:1"), "--rank 2 --world 2"),
    (("--no-lab", "--rank", "0", "--world", "1", "--master", "h:1"), "the world is 2 or more"),
    ((*BASE, "--rank", "0", "--master", "nohost"), "give ADDR:PORT"),
    ((*BASE, "--rank", "0", "--master", "h:99999"), "give ADDR:PORT"),
    ((*BASE, "--rank", "0", "--master", "h:1", "--rate", "1gbit"), "--rate needs the lab"),
    ((*BASE, "--rank", "0", "--master", "h:1", "--fault", "h0:1:down"), "--fault needs the lab"),
    ((*BASE, "--rank", "0", "--master", "h:1", "--hosts", "2"), "--hosts (use --world) needs the lab"),
    ((*BASE, "--rank", "0", "--master", "h:1", "--spin-us", "0,100"), "one value with --no-lab"),
    ((*BASE, "--rank", "0", "--master", "h:1", "--store-timeout", "0"), "--store-timeout"),
    ((*BASE, "--rank", "0", "--master", "h:1", "--sizes", "4Q"), "size '4Q' is not valid"),
    ((*BASE, "--rank", "0", "--master", "h:1", "--backend", "nccl"), "nccl"),
    (("--no-lab", "--rank", "0", "--world", "2", "--master", "h:1", "--rails", "4"), "name the rail interfaces"),
    (("--no-lab", "--rank", "0", "--world", "2", "--master", "h:1"), "no rails configured"),
    (("--rank", "0"), "add --no-lab"),
    (("--rails", "eth1,eth2"), "the lab takes a count"),
])
def test_bad_input_is_one_line_exit_2(args, words):
    proc = bench(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert words in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len([x for x in proc.stderr.splitlines() if x.startswith("r2cc: error")]) == 1


def test_rails_from_the_rail_map(tmp_path):
    """No --rails: the communicator's own rail map; one that names a namespace is refused."""
    e = env()
    e.update(R2CC_RAILS=RAILS, R2CC_NETNS="r2cc-h{rank}")
    proc = subprocess.run(cmd("--no-lab", "--rank", "0", "--world", "2", "--master", "h:1"), cwd=MAIN, env=e,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "namespace r2cc-h0" in proc.stderr, proc.stderr


@pytest.mark.parametrize("rank, words", [(0, "rank 1 did not join within 2 s"), (1, "rank 1: no store at")])
def test_missing_peer_is_named_within_the_timeout(rank, words):
    port = free_port()
    proc = bench(*BASE, "--rank", str(rank), "--master", f"127.0.0.1:{port}", "--store-timeout", "2",
                 "--sizes", "4K", "--backend", "r2cc", timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr and f"127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_two_ranks_on_loopback(tmp_path):
    """Two ranks started by hand, as two servers would: both exit 0, rank 0 prints r2cc and gloo
    rows, gloo-mptcp and mpi are skipped with a reason, rank 1 says it took part."""
    master = f"127.0.0.1:{free_port()}"
    args = (*BASE, "--master", master, "--sizes", "4K,64K", "--iters", "3", "--warmup", "1",
            "--backend", "r2cc,gloo,gloo-mptcp,mpi", "--store-timeout", "60")
    table, out1 = run_two([cmd(*args, "--rank", str(r)) for r in (0, 1)], MAIN, env(), 180)
    for backend in ("r2cc", "gloo"):
        for size in ("4K", "64K"):
            assert any(line.split()[:2] == [backend, size] and "exact" in line for line in table.splitlines()), table
    assert "gloo-mptcp     skipped:" in table and "mpi            skipped: needs mpirun" in table
    assert "(existing hosts)" in table
    assert "rank 1 of 2: took part in r2cc, gloo" in out1
