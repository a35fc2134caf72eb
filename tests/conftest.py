"""One way for a test to say what it needs: `@pytest.mark.requires("root", "nft", ...)`.

A need that is not met skips the test with a reason that says what to install or how to run.
Inside a fixture, `require(...)` (from tests.conftest) does the same.
Needs: "root"; "vllm" (the `vllm` command, and not left out with R2CC_E2E=0); "mpi" (mpirun
and mpi4py); "mptcp" (a kernel with MPTCP and Debian's mptcpize); or the name of a command
(ip, tc, nft, ...). Markers on a module (`pytestmark`), a class or a test all count.
"""

from __future__ import annotations

import functools
import os
import shutil

import pytest

# The checkout's test bed for every process a test starts too (`python -m r2cc_serve.cli lab ...`,
# spawned ranks, vLLM nodes), as pyproject.toml's `pythonpath` gives it to this one: whatever
# r2cc-testbed is installed, the tests run this checkout's.
_TESTBED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "testbed")
os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in (_TESTBED, os.environ.get("PYTHONPATH")) if p))

_PACKAGE_OF = {"ip": "iproute2", "tc": "iproute2", "nstat": "iproute2", "nft": "nftables", "sysctl": "procps",
               "unshare": "util-linux", "mpirun": "openmpi-bin libopenmpi-dev", "git": "git", "diff": "diffutils"}


@functools.cache
def why_missing(need: str) -> str | None:
    """None if `need` is met here, else the reason a test that needs it is skipped."""
    if need == "root":
        return None if os.geteuid() == 0 else "needs root (network namespaces, tc, nftables): run the tests as root"
    if need == "vllm":
        if os.environ.get("R2CC_E2E", "1") == "0":
            return "R2CC_E2E=0: end-to-end vLLM tests left out"
        return None if shutil.which("vllm") else "vLLM is not installed; run scripts/install_vllm.sh"
    if need == "mpi":
        try:
            import mpi4py  # noqa: F401 - only whether it imports
        except ImportError:
            return "needs mpi4py: pip install mpi4py"
        return why_missing("mpirun")
    if need == "mptcp":
        from r2cc_serve.errors import UserError
        from r2cc_testbed.lab import mptcp

        if not mptcp.supported():
            return "this kernel has no MPTCP (net.mptcp.enabled) or iproute2 lacks `ip mptcp`"
        try:
            mptcp.preload_env()
        except UserError as exc:
            return str(exc)
        return None
    if shutil.which(need) is None:
        return f"needs the `{need}` command: apt-get install -y {_PACKAGE_OF.get(need, need)}"
    return None


def require(*needs: str) -> None:
    """Skip the running test (or fixture) unless every need is met."""
    for need in needs:
        reason = why_missing(need)
        if reason:
            pytest.skip(reason)


def pytest_configure(config):
    config.addinivalue_line("markers", "requires(*needs): skip unless every need is met "
                                       "(root, vllm, mpi, mptcp, or a command name); see tests/conftest.py")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    for mark in item.iter_markers("requires"):
        require(*mark.args)
