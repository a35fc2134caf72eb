"""`r2cc bench --no-lab` in the two hosts of a lab, started by hand as if they were real servers:
no R2CC_NETNS and no lab helpers in the ranks, rank 0's store on h0's management address.

The lab has a prefix of its own (r2ccx), so no other lab is touched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.testbed.bench.two_ranks import run_two

pytestmark = [pytest.mark.lab, pytest.mark.requires("root", "ip", "tc")]

MAIN = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PREFIX = "r2ccx"
STATE = f"/run/r2cc-lab/{PREFIX}-state.json"
RAILS = "rail0,rail1,rail2,rail3"


def lab_env() -> dict:
    env = dict(os.environ, R2CC_LAB_PREFIX=PREFIX, R2CC_LAB_STATE=STATE)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (MAIN, env.get("PYTHONPATH")) if p)
    return env


def server_env() -> dict:
    """What a real server has: none of the lab's or the rail map's variables."""
    env = {k: v for k, v in lab_env().items() if not k.startswith("R2CC_")}
    return env


def r2cc(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "r2cc_serve.cli", *args], cwd=MAIN, env=lab_env(),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def mgmt_address(host: str) -> str:
    out = subprocess.run(["ip", "netns", "exec", host, "ip", "-j", "-4", "addr", "show", "mgmt0"],
                         capture_output=True, text=True, check=True, timeout=10).stdout
    return json.loads(out)[0]["addr_info"][0]["local"]


@pytest.fixture
def lab():
    r2cc("lab", "up", "--hosts", "2", "--rails", "4", "--rate", "1gbit")
    try:
        yield
    finally:
        subprocess.run([sys.executable, "-m", "r2cc_serve.cli", "lab", "down"], cwd=MAIN, env=lab_env(),
                       capture_output=True, timeout=60)


def test_existing_hosts_mode_in_the_lab(lab):
    master = f"{mgmt_address(PREFIX + '-h0')}:29611"
    sizes = os.environ.get("R2CC_TEST_BENCH_SIZES", "4K,1M")
    iters = os.environ.get("R2CC_TEST_BENCH_ITERS", "3")
    args = ["--no-lab", "--world", "2", "--master", master, "--rails", RAILS, "--sizes", sizes,
            "--iters", iters, "--backend", "r2cc,gloo", "--store-timeout", "60"]
    out0, out1 = run_two([["ip", "netns", "exec", f"{PREFIX}-h{r}", sys.executable, "-m", "r2cc_serve.cli", "bench",
                           *args, "--rank", str(r)] for r in (0, 1)], MAIN, server_env(), 240)
    print(out0)
    table = out0.splitlines()
    for backend in ("r2cc", "gloo"):
        assert any(line.split()[:1] == [backend] and "exact" in line for line in table), out0
    assert "rank 1 of 2: took part in r2cc, gloo" in out1
