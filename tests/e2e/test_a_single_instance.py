"""Deployment (a): one vLLM, TP=2, rank r's rails in lab host r, r2cc backend."""

from __future__ import annotations

import pytest

from r2cc_serve.serving import evidence
from r2cc_serve.serving.deploy import single_instance
from r2cc_serve.serving.faults import FaultSpec
from r2cc_serve.serving.load import compare, run_load
from r2cc_serve.serving.scenario import run_with_fault
from tests.comm.harness import free_port
from tests.e2e.conftest import LOAD, SERVE_ARGS


@pytest.fixture(scope="module")
def dep(lab, model_dir, session, reference):  # reference first: one deployment at a time
    with single_instance(lab, model_dir, backend="r2cc", port=free_port(), extra_args=SERVE_ARGS) as d:
        session.deployments.append(d)
        yield d


def test_r2cc_serves_the_same_tokens_as_the_default_backend(dep, reference):
    before = evidence.rail_totals(evidence.read_status(dep.status_dir))
    run = run_load(dep.url, dep.model, LOAD)
    after = evidence.rail_totals(evidence.read_status(dep.status_dir))
    assert not run.failed, run.summary()
    assert compare(reference, run) == []
    # The tokens really went through r2cc, striped over every data rail.
    sent = evidence.diff_totals(before, after)
    assert all(sent.get(k, {}).get("bytes_sent", 0) > 0 for k in range(4)), sent


def test_rail_down_during_generation(dep, reference):
    out = run_with_fault(dep, FaultSpec("down", host=1, rail=2, after_s=2, hold_s=4), LOAD, reference)
    assert out.problems() == [], out.summary()
