"""Deployment (a): one vLLM, TP=2, rank r's rails in lab host r, r2cc backend."""

from __future__ import annotations

import pytest

from r2cc_serve.testbed.serving.deploy import single_instance
from r2cc_serve.testbed.serving.fault_hold import FaultSpec
from r2cc_serve.testbed.serving.fault_run import run_with_fault
from tests.comm.harness import free_port
from tests.e2e.conftest import LOAD, SERVE_ARGS, assert_serves_reference_tokens_over_every_rail


@pytest.fixture(scope="module")
def dep(lab, model_dir, session, reference):  # reference first: one deployment at a time
    with single_instance(lab, model_dir, backend="r2cc", port=free_port(), extra_args=SERVE_ARGS) as d:
        session.deployments.append(d)
        yield d


def test_r2cc_serves_the_same_tokens_as_the_default_backend(dep, reference):
    assert_serves_reference_tokens_over_every_rail(dep, reference)


def test_rail_down_during_generation(dep, reference):
    out = run_with_fault(dep, FaultSpec("down", host=1, rail=2, after_s=2, hold_s=4), LOAD, reference)
    assert out.problems() == [], out.report()
