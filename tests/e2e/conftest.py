"""Shared set-up of the end-to-end serving tests: one lab, one model, one reference.

Cost model (2 loaded cores): a vLLM TP=2 deployment takes 1-1.5 min to start and warm up,
so the fault-free reference of the default backend is computed once per session, and the two
r2cc deployments most tests need are shared across modules: `r2cc_single` (one vLLM, TP=2,
rank r's rails in lab host r) and `r2cc_two_nodes` (one vLLM node per lab host), both with the
admin token ADMIN_TOKEN. Only one deployment runs at a time (the box has 2 cores): the tests
are ordered so that every user of one shared deployment runs in a row (single first, then two
nodes, then the modules that start their own), asking for the other one stops the first, and a
module that starts its own deployment stops the shared one first. Each module gets the shared
deployment settled: it starts with every rail of every rank up, no hold left by the
module before (up to SETTLE_TIMEOUT_S, else its first test fails naming the rails).

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
import time

import pytest

from r2cc_testbed.serving.load import LoadSpec
from tests.comm.harness import free_port

PREFIX = os.environ.get("R2CC_E2E_LAB_PREFIX", "r2cce")
STATE = f"/run/r2cc-lab/{PREFIX}-e2e-state.json"
# R2CC_E2E_SERIAL=1: one sequence at a time, fully batch-invariant (see the docstring) at the
# cost of concurrency inside the engine; use it if a token mismatch ever looks like batching.
SERVE_ARGS = ("--dtype", "float32") + (("--max-num-seqs", "1") if os.environ.get("R2CC_E2E_SERIAL") == "1" else ())
LOAD = LoadSpec(max_tokens=16, concurrency=4, request_timeout_s=240, deadline_s=480)
E2E_TIMEOUT_S = 900  # per test, set-up of its module deployment included
ADMIN_TOKEN = "e2e-admin-token"  # R2CC_ADMIN_TOKEN of the shared deployments
SHARED = ("r2cc_single", "r2cc_two_nodes")  # the shared deployments' fixtures, in run order
# A shared deployment handed to the next module only once every rail is back: a flap hold from the
# test before lasts up to 2 x R2CC_HOLD_S after its last failure, and the all-down test's 20 s.
SETTLE_TIMEOUT_S = 90.0


def striped_load() -> LoadSpec:
    """One ~400-token prompt never seen before. r2cc puts a short message on one or two rails, by
    design (stripe_rails, csrc/messages.h): LOAD's prefills reach rails 2 and 3 only when vLLM
    batches ~200 tokens into one step, which a CI run once did not. This prompt's prefill (1 KiB a
    token, twice what r2cc needs to use all four rails before it has measured them) goes over
    every rail whatever the batching; its first words are new each call, or vLLM's prefix cache
    would prefill only its last few tokens."""
    words = " ".join(f"Rail {i % 4} carries chunk {i} of the transfer." for i in range(20))
    return LoadSpec(prompts=[f"Sent at {time.time_ns()}. {words}"], max_tokens=1, concurrency=1,
                    request_timeout_s=240, deadline_s=240)


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


def _shared_rank(item) -> int:
    """Run order of an e2e test: users of r2cc_single, of r2cc_two_nodes, then the rest (in file
    order, so test_z_nothing_left.py stays last)."""
    for k, name in enumerate(SHARED):
        if name in item.fixturenames:
            return k
    return len(SHARED)


def pytest_collection_modifyitems(config, items):
    """Files here need vLLM and the lab unless they say otherwise with a module-level
    NEEDS = "root" (root only, e.g. the fake-vLLM clean-up test) or NEEDS = "nothing".
    The e2e tests are reordered among themselves so that each shared deployment starts once."""
    here = os.path.dirname(os.path.abspath(__file__))
    slots = [i for i, item in enumerate(items) if str(item.fspath).startswith(here)]
    ordered = sorted((items[i] for i in slots), key=_shared_rank)  # stable: file order within a group
    for i, item in zip(slots, ordered):
        items[i] = item
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
    """What the tests left in the world, checked by test_z_nothing_left.py at the end, and the
    shared deployment running now (at most one)."""

    def __init__(self):
        self.deployments = []  # every Deployment started in this session
        self.lab_cm = None
        self.lab = None
        self.shared_name = None
        self.shared_cm = None
        self.shared_dep = None
        self.shared_error = None  # a shared deployment that failed to start is not retried per test

    def shared(self, name: str, start):
        """The shared deployment `name`, started with start() (a deployment context manager)
        unless it runs already; any other shared deployment is stopped first."""
        if self.shared_name != name:
            self.release_shared()
            self.shared_name = name
            try:
                cm = start()
                self.shared_dep = cm.__enter__()
                self.shared_cm = cm
            except BaseException as exc:
                self.shared_error = exc
                raise
            self.deployments.append(self.shared_dep)
        if self.shared_error is not None:
            pytest.fail(f"the shared deployment {name} did not start: {self.shared_error}", pytrace=False)
        return self.shared_dep

    def release_shared(self) -> None:
        cm, self.shared_cm, self.shared_dep = self.shared_cm, None, None
        self.shared_name, self.shared_error = None, None
        if cm is not None:
            cm.__exit__(None, None, None)

    def close_lab(self) -> None:
        self.release_shared()
        if self.lab_cm is not None:
            cm, self.lab_cm = self.lab_cm, None
            cm.__exit__(None, None, None)


@pytest.fixture(scope="session")
def session():
    s = Session()
    yield s
    s.close_lab()


@pytest.fixture(scope="module", autouse=True)
def _one_deployment_at_a_time(request, session):
    """A module that starts its own deployment stops the shared one first (module scope: before
    the module's own deployment fixture)."""
    if not getattr(request.module, "USES_SHARED_DEPLOYMENT", False):
        session.release_shared()


@pytest.fixture(scope="session")
def lab(session):
    from r2cc_testbed.lab.session import lab_session

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
    from r2cc_testbed.serving.deploy import single_instance
    from r2cc_testbed.serving.load import run_load

    with single_instance(lab, model_dir, backend="default", port=free_port(), extra_args=SERVE_ARGS) as dep:
        session.deployments.append(dep)
        ref = run_load(dep.url, dep.model, LOAD)
    assert not ref.failed, f"reference run had failures: {ref.summary()}"
    return ref


def assert_serves_reference_tokens_over_every_rail(dep, reference) -> None:
    """A load on `dep` gives the reference's tokens with no failed request, and every data rail
    carried bytes meanwhile (the tokens really went through r2cc, striped: striped_load()'s long
    prefill is what must reach every rail)."""
    from r2cc_testbed.serving import evidence
    from r2cc_testbed.serving.load import compare, run_load

    before = evidence.rail_totals(evidence.read_status_now(dep.status_dir))
    run = run_load(dep.url, dep.model, LOAD)
    striped = run_load(dep.url, dep.model, striped_load())
    after = evidence.rail_totals(evidence.read_status_now(dep.status_dir))
    assert not run.failed and not striped.failed, (run.summary(), striped.summary())
    assert compare(reference, run) == []
    sent = evidence.diff_totals(before, after)
    assert all(sent.get(k, {}).get("bytes_sent", 0) > 0 for k in range(4)), sent


def e2e_log_dir(name: str) -> str | None:
    """R2CC_E2E_LOG_DIR keeps the vLLM logs of the deployments (they explain a failed test)."""
    root = os.environ.get("R2CC_E2E_LOG_DIR")
    return os.path.join(root, name) if root else None


def wait_settled(dep, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
    """Until every rail of every rank is up again (holds and recoveries of the module before
    over); fails naming the rails that are not, with their state, hold and last error."""
    from r2cc_testbed.serving import evidence

    dep.check_alive()
    deadline = time.monotonic() + timeout_s
    while True:
        status = evidence.read_status(dep.status_dir)
        not_up = evidence.rails_not_up(status)
        if status and not not_up:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the shared {dep.shape} deployment's rails were not all up {timeout_s:.0f} s after "
                                 f"the module before ended: {not_up or 'no status file'}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def r2cc_single(lab, model_dir, session, reference):  # reference first: one deployment at a time
    """The shared one-vLLM TP=2 r2cc deployment, settled."""
    from r2cc_testbed.serving.deploy import single_instance

    dep = session.shared("r2cc_single", lambda: single_instance(
        lab, model_dir, backend="r2cc", port=free_port(), extra_args=SERVE_ARGS,
        extra_env={"R2CC_ADMIN_TOKEN": ADMIN_TOKEN}, log_dir=e2e_log_dir("r2cc-single")))
    wait_settled(dep)
    return dep


@pytest.fixture(scope="module")
def r2cc_two_nodes(lab, model_dir, session, reference):
    """The shared two-node r2cc deployment (node r in lab host r), settled."""
    from r2cc_testbed.serving.deploy import two_nodes

    dep = session.shared("r2cc_two_nodes", lambda: two_nodes(
        lab, model_dir, backend="r2cc", port=free_port(), extra_args=SERVE_ARGS,
        extra_env={"R2CC_ADMIN_TOKEN": ADMIN_TOKEN}, log_dir=e2e_log_dir("r2cc-two-nodes")))
    wait_settled(dep)
    return dep
