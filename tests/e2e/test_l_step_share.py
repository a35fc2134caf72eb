"""`r2cc serve-bench` for real, at its smallest: the share of a decode step spent inside collectives
comes out for r2cc and vLLM's default backend, timed the same way in each worker.

Slow (two two-node deployments, ~5 min on a quiet box): `pytest -m slow tests/e2e/test_l_step_share.py`.
serve-bench builds a lab of its own, with the prefix R2CC_E2E_LAB_PREFIX + "sb", so it runs beside
the e2e session's lab and anyone else's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.comm.harness import free_port
from tests.e2e.conftest import PREFIX

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
BACKENDS = ("default", "r2cc")


def test_serve_bench_prints_the_collective_share_of_a_decode_step(tmp_path):
    prefix = f"{PREFIX}sb"[:10]
    env = dict(os.environ, R2CC_LAB_PREFIX=prefix, R2CC_LAB_STATE=f"/run/r2cc-lab/{prefix}-state.json")
    argv = [sys.executable, "-m", "r2cc_serve.cli", "serve-bench", "--backends", ",".join(BACKENDS),
            "--rounds", "1", "--duration", "10", "--max-tokens", "16", "--fault", "none",
            "--port", str(free_port()), "--out", str(tmp_path)]
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1700)
    assert run.returncode == 0, f"serve-bench failed:\n{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
    assert "Inside collectives per decode step" in run.stdout, run.stdout

    doc = json.load(open(tmp_path / "serve-bench.json"))
    ops = {}
    for backend in BACKENDS:
        shares = doc["backends"][backend]["step_share"]
        assert sorted(shares) == ["0", "1"], shares  # both workers wrote their totals
        for rank, v in shares.items():
            d = v["decode"]
            assert d["steps"] > 10 and d["calls_per_step"] > 0, (backend, rank, d)
            assert 0 < d["wall_share"] < 1 and 0 < d["cpu_share"] <= 1 and 0 < d["proc_cpu_share"] <= 1, (backend, rank, d)
            assert 0 < d["coll_s_per_step"] < d["step_s"], (backend, rank, d)
            assert 0 < v["overhead_us_per_call"] < 100, (backend, rank, v)
            row = [line for line in run.stdout.splitlines() if line.split()[:2] == [backend, rank]]
            assert row, f"no table row for {backend} rank {rank}:\n{run.stdout}"
        ops[backend] = doc["backends"][backend]["rounds"][0]["step_share"]["0"]["decode"]["ops_per_step"]
    # The same model makes the same collective calls per decode step whatever carries them.
    assert ops["default"] == ops["r2cc"] and ops["r2cc"].get("all_reduce", 0) >= 1, ops
