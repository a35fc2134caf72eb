"""Shared set-up of the end-to-end serving tests: one lab, one model, one reference.

Cost model (2 loaded cores): a vLLM TP=2 deployment takes 1.5-3 min to start and warm up,
so each deployment is module-scoped and shared by several tests, and the fault-free
reference of the default backend is computed once per session.

The model is float32 served with `--dtype float32`: in bfloat16 vLLM's own greedy output
depends on how requests are batched (seen here: prompt "Hello", token 31, 774 vs 630 between
concurrency 1 and 4 with the default backend), so a fault run, whose batches differ from the
reference's, could not be compared token for token. In float32 it is far rarer but not gone:
serve-bench saw 4 of ~30 64-token requests differ between fault-free rounds of the default
backend; with 16 tokens x 8 prompts no mismatch was seen in any run so far.

Lab: prefix R2CC_E2E_LAB_PREFIX (default r2cce; subnets 10.206/10.207, derived from the prefix,
so it runs beside the other test labs; the lab still waits up to 10 min if another lab holds them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from r2cc_serve.testbed.serving.load import LoadSpec
from tests.comm.harness import free_port

PREFIX = os.environ.get("R2CC_E2E_LAB_PREFIX", "r2cce")
STATE = f"/run/r2cc-lab/{PREFIX}-e2e-state.json"
# R2CC_E2E_SERIAL=1: one sequence at a time, fully batch-invariant (see the docstring) at the
# cost of concurrency inside the engine; use it if a token mismatch ever looks like batching.
SERVE_ARGS = ("--dtype", "float32") + (("--max-num-seqs", "1") if os.environ.get("R2CC_E2E_SERIAL") == "1" else ())
LOAD = LoadSpec(max_tokens=16, concurrency=4, request_timeout_s=240, deadline_s=480)
E2E_TIMEOUT_S = 900  # per test, set-up of its module deployment included


def _why_skip() -> str | None:
    if os.geteuid() != 0:
        return "e2e serving tests need root (lab namespaces); run them as root"
    missing = [t for t in ("ip", "tc", "nft", "unshare") if shutil.which(t) is None]
    if missing:
        return f"missing {', '.join(missing)}: apt-get install -y iproute2 nftables util-linux"
    if shutil.which("vllm") is None:
        return "vLLM is not installed (no `vllm` on PATH); run scripts/install_vllm.sh"
    try:
        from r2cc_serve.vllm import compat as vllm_compat

        vllm_compat.check_vllm_version()
    except Exception as exc:  # noqa: BLE001 - any reason means: cannot serve
        return f"vLLM is not usable: {exc}"
    return None


SKIP_REASON = _why_skip()


def _opted_in(config) -> bool:
    """Part of the default run (~10 minutes); R2CC_E2E=0 or -m 'not vllm' leaves them out."""
    return os.environ.get("R2CC_E2E", "1") != "0"


def pytest_collection_modifyitems(config, items):
    """Files here need vLLM and the lab unless they say otherwise with a module-level
    NEEDS = "root" (root only, e.g. the fake-vLLM clean-up test) or NEEDS = "nothing"."""
    here = os.path.dirname(os.path.abspath(__file__))
    not_asked = None if _opted_in(config) else \
        "R2CC_E2E=0: end-to-end vLLM tests left out"
    for item in items:
        if not str(item.fspath).startswith(here):
            continue
        needs = getattr(item.module, "NEEDS", "vllm")
        if needs == "root" and os.geteuid() != 0:
            item.add_marker(pytest.mark.skip(reason="needs root (private /dev/shm mount per node)"))
        if needs != "vllm":
            continue
        item.add_marker(pytest.mark.vllm)
        item.add_marker(pytest.mark.lab)
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(E2E_TIMEOUT_S))
        if SKIP_REASON or not_asked:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON or not_asked))


class Session:
    """What the tests left in the world, checked by test_z_nothing_left.py at the end."""

    def __init__(self):
        self.deployments = []  # every Deployment started in this session
        self.lab_cm = None
        self.lab = None

    def close_lab(self) -> None:
        if self.lab_cm is not None:
            cm, self.lab_cm = self.lab_cm, None
            cm.__exit__(None, None, None)


@pytest.fixture(scope="session")
def session():
    s = Session()
    yield s
    s.close_lab()


@pytest.fixture(scope="session")
def lab(session):
    from r2cc_serve.testbed.lab.session import lab_session

    cm = lab_session(hosts=2, rails=4, rate="1gbit", prefix=PREFIX, state=STATE, wait_s=600)
    session.lab = cm.__enter__()
    session.lab_cm = cm
    return session.lab


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("model") / "tiny-f32"
    subprocess.run([sys.executable, "-m", "r2cc_serve.cli", "model", "make", str(out), "--dtype", "float32"],
                   check=True, capture_output=True, timeout=300)
    return str(out)


@pytest.fixture(scope="session")
def reference(lab, model_dir, session):
    """Fault-free greedy outputs of vLLM's default backend (single instance, TP=2)."""
    from r2cc_serve.testbed.serving.deploy import single_instance
    from r2cc_serve.testbed.serving.load import run_load

    with single_instance(lab, model_dir, backend="default", port=free_port(), extra_args=SERVE_ARGS) as dep:
        session.deployments.append(dep)
        ref = run_load(dep.url, dep.model, LOAD)
    assert not ref.failed, f"reference run had failures: {ref.summary()}"
    return ref


def assert_serves_reference_tokens_over_every_rail(dep, reference) -> None:
    """A load on `dep` gives the reference's tokens with no failed request, and every data rail
    carried bytes meanwhile (the tokens really went through r2cc, striped)."""
    from r2cc_serve.testbed.serving import evidence
    from r2cc_serve.testbed.serving.load import compare, run_load

    before = evidence.rail_totals(evidence.read_status_now(dep.status_dir))
    run = run_load(dep.url, dep.model, LOAD)
    after = evidence.rail_totals(evidence.read_status_now(dep.status_dir))
    assert not run.failed, run.summary()
    assert compare(reference, run) == []
    sent = evidence.diff_totals(before, after)
    assert all(sent.get(k, {}).get("bytes_sent", 0) > 0 for k in range(4)), sent
