"""Forming a group: a rank that cannot join makes the others fail at once with its reason,
instead of leaving them to wait for the store's timeout (threads of one process, loopback)."""

from __future__ import annotations

import datetime
import time

import pytest

from tests.comm.harness import run_in_threads

STORE_TIMEOUT_S = 60  # what a rank left waiting would sit out


def _form(rails_of, group: str):
    """Each rank opens a Communicator with rails_of[rank]; per rank, what it raised (or None)
    and how long it took."""
    from torch.distributed import HashStore

    from r2cc_serve import Communicator

    store = HashStore()
    store.set_timeout(datetime.timedelta(seconds=STORE_TIMEOUT_S))

    def open_rank(rank):
        t0 = time.monotonic()
        try:
            Communicator(rank, 2, store, rails=rails_of[rank], group=group).close()
            return None, time.monotonic() - t0
        except Exception as exc:  # noqa: BLE001 - what each rank saw is the result
            return exc, time.monotonic() - t0

    return run_in_threads(open_rank, timeout=STORE_TIMEOUT_S + 30)


@pytest.mark.parametrize("bad_rank", [0, 1])
def test_a_rank_with_a_bad_rail_makes_the_other_fail_at_once_with_its_reason(bad_rank):
    from r2cc_serve.errors import PeerGaveUpError, UserError

    rails = {r: ["127.0.0.1", "127.0.0.2"] for r in (0, 1)}
    rails[bad_rank] = ["127.0.0.1", "no-such-nic9"]
    (err0, t0), (err1, t1) = _form(rails, f"bad-rail-{bad_rank}")
    bad, good = (err0, err1) if bad_rank == 0 else (err1, err0)
    assert isinstance(bad, UserError) and "no-such-nic9" in str(bad), bad
    assert isinstance(good, PeerGaveUpError), good
    assert f"rank {bad_rank} could not join group 'bad-rail-{bad_rank}'" in str(good) and "no-such-nic9" in str(good)
    assert max(t0, t1) < 10, (t0, t1)  # not the store's 60 s


def test_different_numbers_of_rails_fail_on_both_ranks():
    from r2cc_serve.errors import UserError

    (err0, _), (err1, _) = _form({0: ["127.0.0.1", "127.0.0.2"], 1: ["127.0.0.1"]}, "rail-count")
    for err in (err0, err1):
        assert isinstance(err, UserError) and "give every rank the same number of rails" in str(err), err

