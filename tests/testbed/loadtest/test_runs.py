"""The load-test runner end to end with vLLM: `--quick` in the default run, the full suite slow.

Each run is the CLI in a child process (what a user types), with its own lab prefix. Asserted:
no failed request and identical outputs on r2cc, rounds that completed, a report with figures,
and nothing left behind (lab namespaces, vLLM processes). Timing is not asserted: this box is
shared; the report carries the numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from r2cc_testbed.lab.netns import list_netns
from tests.comm.harness import free_port


pytestmark = [pytest.mark.vllm, pytest.mark.lab, pytest.mark.requires("root", "vllm", "ip", "tc", "nft")]


def _run(tmp_path, prefix: str, *scenario_args: str, timeout_s: float) -> dict:
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "r2cc_serve.cli", "loadtest", "run", *scenario_args, "--out", str(out),
            "--port", str(free_port()), "--lab-prefix", prefix]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert (out / "report.md").exists(), proc.stderr[-3000:]
    assert not [n for n in list_netns() if n.startswith(f"{prefix}-")], "the run left its lab up"
    assert not subprocess.run(["pgrep", "-f", f"loadtest.*{out}"], capture_output=True).stdout
    with open(out / "report.json") as f:
        return json.load(f)


def _assert_r2cc_lossless(report: dict) -> None:
    for a in report["scenarios"]:
        r2cc = a["backends"]["r2cc"]
        name = a["scenario"]["name"]
        assert r2cc["rounds"] and not r2cc["unfinished_rounds"], (name, r2cc["rounds"], r2cc["notes"])
        assert r2cc["failed"] == 0, (name, [r["first_error"] for r in r2cc["rounds"]])
        diffs = r2cc["outputs"]["faulted_vs_fault_free"]
        assert diffs and all(d["compared"] > 0 and d["differ"] == 0 for d in diffs), (name, diffs)
        assert r2cc["fault_timing"]["steps"] > 0 and not r2cc["fault_timing"]["errors"], (name, r2cc["fault_timing"])
        assert len(a["figures"]) == 4


@pytest.mark.slow  # 1-2 min: outside the default run, in CI (-m ci)
@pytest.mark.ci
@pytest.mark.timeout(900)
def test_quick_scenario_end_to_end(tmp_path):
    report = _run(tmp_path, "r2cclq", "rail-down-restore", "--quick", timeout_s=840)
    _assert_r2cc_lossless(report)


@pytest.mark.slow
@pytest.mark.timeout(6 * 3600)
def test_every_shipped_scenario(tmp_path):
    report = _run(tmp_path, "r2cclq", "all", timeout_s=6 * 3600 - 60)
    assert len(report["scenarios"]) == 8
    _assert_r2cc_lossless(report)
