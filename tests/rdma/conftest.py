"""Tests in the emulated RDMA guest (r2cc_testbed.guest): each boots a qemu VM, so they are marked
rdma and slow. Host-side tests boot it with `guest.run`; `guest_pytest` runs a whole in-guest
module (in_guest/, collected only inside the guest) in one boot and returns its junit cases.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from r2cc_testbed.guest import pytest_job
from tests.conftest import require

IN_GUEST = "R2CC_GUEST_RAILS" in os.environ  # guest_init.sh sets it
# In-guest modules need the rails; on the host they are run through guest_pytest, not collected.
collect_ignore_glob = [] if IN_GUEST else ["in_guest/*"]

# Up to this long to build the guest the first time (kernel download, r2cc's 30 files compiled in
# it): the session's first guest test pays it in its set-up. pyproject's 300 s per test stopped a
# busy CI run mid-build with a stack dump instead of the guest runner's own message.
GUEST_BUILD_S = 900


def guest_time_limit(guest_s: float):
    """A guest test's pytest-timeout mark: its guest run's own limit plus the first build."""
    return pytest.mark.timeout(guest_s + GUEST_BUILD_S)


@pytest.fixture(scope="session")
def guest_build():
    """The guest's cached build (the first build installs packages and downloads the kernel)."""
    require("root")
    from r2cc_testbed.guest import build

    return build()


@dataclass
class GuestPytest:
    result: object  # r2cc_testbed.guest.GuestResult
    cases: list  # pytest_job.Case, from the junit XML

    def outcomes(self) -> dict[str, str]:
        return {c.name.rsplit(".", 1)[-1]: c.outcome for c in self.cases}

    def failures(self) -> list:
        return [c for c in self.cases if c.outcome in ("failed", "error")]


@pytest.fixture
def guest_pytest(guest_build, tmp_path):
    """guest_pytest("tests/rdma/in_guest/test_x.py", rails=2) -> GuestPytest (one boot for the module)."""
    from r2cc_testbed import guest

    def run_module(*paths: str, rails: int = 2, timeout_s: float = 900.0, extra=()) -> GuestPytest:
        result = guest.run(pytest_job.command(paths, extra), rails=rails, timeout_s=timeout_s,
                           out_dir=str(tmp_path), build=guest_build, on_line=print)
        xml = tmp_path / pytest_job.JUNIT
        return GuestPytest(result, pytest_job.parse_junit(xml.read_text()) if xml.exists() else [])

    return run_module
