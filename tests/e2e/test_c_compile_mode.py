"""torch.compile mode (no --enforce-eager) with r2cc serves the same tokens.

Slow (compiling adds 1-2 min on 2 cores): marked `slow`, run with `-m slow` or `-m "vllm"`
explicitly selecting it; `r2cc serve-bench --compile` exercises the same path.
"""

from __future__ import annotations

import pytest

from r2cc_testbed.serving.deploy import single_instance
from r2cc_testbed.serving.load import compare, run_load
from tests.comm.harness import free_port
from tests.e2e.conftest import LOAD, SERVE_ARGS


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_compile_mode_serves_the_same_tokens(lab, model_dir, session, reference):
    with single_instance(lab, model_dir, backend="r2cc", port=free_port(), enforce_eager=False,
                         extra_args=SERVE_ARGS, startup_timeout_s=1200) as dep:
        session.deployments.append(dep)
        run = run_load(dep.url, dep.model, LOAD)
    assert not run.failed, run.summary()
    assert compare(reference, run) == []
