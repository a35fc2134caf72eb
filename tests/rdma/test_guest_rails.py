"""The rails' in-guest checks (in_guest/test_rails.py), one boot with three rails, read back as junit."""

from __future__ import annotations

import pytest

from tests.rdma.conftest import guest_time_limit

GUEST_TIMEOUT_S = 900
pytestmark = [pytest.mark.rdma, pytest.mark.slow, guest_time_limit(GUEST_TIMEOUT_S)]


def test_rails_in_the_guest_are_independent(guest_pytest):
    run = guest_pytest("tests/rdma/in_guest/test_rails.py", rails=3, timeout_s=GUEST_TIMEOUT_S)
    print(run.result.summary())
    assert run.cases, f"no junit report: {run.result.summary()}\n{run.result.output[-3000:]}"
    assert not run.failures(), "\n".join(f"{c.name}: {c.message}" for c in run.failures())
    assert set(run.outcomes().values()) == {"passed"}
    assert run.result.ok
