"""Deployment (b): one vLLM node per lab host (--nnodes 2, node 1 headless), r2cc backend.

Every fault is injected while 4 streams decode; outputs must equal the fault-free reference
of vLLM's default backend, no request may fail, and the r2cc workers must show the broken
rail leaving service (status files / logs) and coming back. The shared r2cc_two_nodes
deployment of conftest.py.
"""

from __future__ import annotations

import pytest

from r2cc_testbed.serving import evidence
from r2cc_testbed.faults.model import FaultSpec
from r2cc_testbed.serving.fault_experiment import run_with_fault
from tests.e2e.conftest import LOAD, assert_serves_reference_tokens_over_every_rail

USES_SHARED_DEPLOYMENT = True


@pytest.fixture(scope="module")
def dep(r2cc_two_nodes):
    return r2cc_two_nodes


def test_two_nodes_serve_the_same_tokens_as_the_default_backend(dep, reference):
    assert_serves_reference_tokens_over_every_rail(dep, reference)
    # Each node writes the status file of its own rank: both ranks are r2cc.
    ranks = sorted(d.get("rank") for d in evidence.read_status(dep.status_dir).values())
    assert ranks == [0, 1]


@pytest.mark.parametrize("kind,host,rail", [
    ("down", 0, 1),
    ("blackhole", 1, 2),
    ("flap", 0, 3),
    ("drain", 1, 0),
])
def test_fault_during_generation(dep, reference, kind, host, rail):
    out = run_with_fault(dep, FaultSpec(kind, host=host, rail=rail, after_s=2, hold_s=4), LOAD, reference)
    assert out.problems() == [], out.report()


def test_all_rails_of_one_host_down_fallback_keeps_serving(dep, reference):
    out = run_with_fault(dep, FaultSpec("all-down", host=0, after_s=2, hold_s=5), LOAD, reference)
    assert out.problems() == [], out.report()
    mid = out.record.mid_fault
    assert mid["vllm_health"] == 200, mid
    assert {r["status"] for r in mid["r2cc"].values()} == {"degraded"}, mid
    fallback = [k for k, v in out.status_delta.items() if v.get("fallback")]
    assert fallback and sum(out.status_delta[k]["bytes_sent"] for k in fallback) > 0, out.status_delta
