"""The engine survives what r2cc cannot hide: `vllm serve --enable-fault-tolerance` on two nodes.

Every data rail of host 1 goes down for 8 s with no fallback rail, while four long requests
decode. The r2cc group gives up (R2CC_ALL_RAILS_DOWN_GRACE_MS), vLLM keeps the engine
(unhealthy), the requests in flight end at once with r2cc's error naming the rails, and once the
rails are back r2cc's automatic retry (R2CC_FT_AUTO_RETRY, on by default) re-forms the group and
resumes the engine: same processes, model loaded once, the same tokens as before the outage,
and r2cc's admin API reports the new groups healthy.

About 2 minutes: one deployment (~60 s to start and warm up), the outage and two short loads.
The figure's 30 s outage, the operator's retry and the run without the flag: `r2cc` commands in
docs/failure-model.md ("When the engine survives it").
"""

from __future__ import annotations

import pytest

from r2cc_testbed.serving.deploy import two_nodes
from r2cc_testbed.serving.load import LoadSpec
from r2cc_testbed.serving.outage_experiment import run_outage
from r2cc_serve.vllm.fault_tolerance import GAVE_UP
from tests.e2e.conftest import SERVE_ARGS

# Its own deployment and an outage (~2 min): outside the default run's budget, in CI (-m ci).
pytestmark = [pytest.mark.slow, pytest.mark.ci]

HOLD_S = 8.0
LOAD = LoadSpec(max_tokens=16, concurrency=4, request_timeout_s=120, deadline_s=240)


@pytest.fixture(scope="module")
def dep(lab, model_dir, session):
    with two_nodes(lab, model_dir, backend="r2cc", port=8330, extra_args=SERVE_ARGS + ("--enable-fault-tolerance",),
                   extra_env={"R2CC_FALLBACK_RAILS": "", "R2CC_FT_AUTO_RETRY": "1"}) as d:
        session.deployments.append(d)
        yield d


@pytest.mark.timeout(420)
def test_all_rails_of_a_host_down_the_engine_survives_and_resumes_by_itself(dep):
    out = run_outage(dep, LOAD, host=1, hold_s=HOLD_S, recover_timeout_s=30)
    s = out.summary()
    assert not out.errors, s
    # In flight: ended at once, aborted, with r2cc's reason naming every rail of the lab.
    assert len(out.inflight) == 4 and all(t is not None and t < 2.0 for t in out.inflight_end_s()), s
    rails = [dep.lab.rail_ifname(k) for k in range(dep.lab.rails)]
    for r in out.inflight:
        assert r["finish_reason"] == "abort", r
        assert GAVE_UP in (r["stop_reason"] or "") and all(f"{name} " in r["stop_reason"] for name in rails), r
    # The engine: unhealthy with that reason during the outage, never dead, back within 5 s of the rails.
    assert out.unhealthy_at is not None and any(st == "unhealthy" and GAVE_UP in info for _, st, info in out.status), s
    assert not any(st in ("dead", "down") for _, st, _ in out.status), s
    assert out.served_again_at is not None and out.served_again_at - out.restored_at < 5.0, s
    # A request sent halfway through the outage waited in the engine's queue and was served after
    # it: once the rails began to come back (on a busy box it ended 1 ms before the last was up).
    assert out.queued and out.queued["ok"] and out.queued["ended_at"] > out.restoring_at, s
    # No restart, no reload, the same tokens.
    assert out.procs_alive_after and out.model_loads == 2, s
    assert len(out.after.ok) == len(LOAD.prompts) and not out.after.failed, s
    assert out.token_diffs == [], s
    # r2cc's admin API follows the re-formed groups (their new control agents).
    assert out.admin_health_after and out.admin_health_after["status"] == "ok", s
