"""Deployment (a): one vLLM, TP=2, rank r's rails in lab host r, r2cc backend (the shared
r2cc_single deployment of conftest.py)."""

from __future__ import annotations

import pytest

from r2cc_testbed.faults.model import FaultSpec
from r2cc_testbed.serving.fault_experiment import run_with_fault
from tests.e2e.conftest import LOAD, assert_serves_reference_tokens_over_every_rail

USES_SHARED_DEPLOYMENT = True


@pytest.fixture(scope="module")
def dep(r2cc_single):
    return r2cc_single


def test_r2cc_serves_the_same_tokens_as_the_default_backend(dep, reference):
    assert_serves_reference_tokens_over_every_rail(dep, reference)


def test_rail_down_during_generation(dep, reference):
    out = run_with_fault(dep, FaultSpec("down", host=1, rail=2, after_s=2, hold_s=4), LOAD, reference)
    assert out.problems() == [], out.report()
