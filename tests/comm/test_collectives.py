"""Multi-process collectives over loopback rails (127.0.0.1-3): every op, dtype and odd size."""

import pytest

from tests.comm import workers
from tests.comm.harness import run_ranks

SIZES = [0, 1, 7, 1000, 65536 + 5, (1 << 20) + 3]


@pytest.mark.parametrize("world", [2, 3])
def test_every_collective_is_bit_exact(world):
    results = run_ranks(workers.all_collectives, world, SIZES, {}, timeout=240)
    assert results == [[]] * world


@pytest.mark.slow  # ~50 s on 2 cores (four ranks): outside the default run, in CI (-m ci)
@pytest.mark.ci
def test_four_ranks_and_tiny_chunks_give_identical_bits():
    # Small chunks and pipeline slices change how bytes travel, never the result.
    results = run_ranks(workers.all_collectives, 4, [0, 5, 70001], {"chunk_bytes": 16384}, timeout=240)
    assert results == [[]] * 4


def test_spinning_waiters_give_identical_bits():
    # R2CC_SPIN_US: the waiter polls before it sleeps; what it sees must be the finished bytes.
    results = run_ranks(workers.all_collectives, 2, [1, 1000, 65536 + 5], {"spin_us": 200}, timeout=240)
    assert results == [[]] * 2


def test_spinning_small_messages_survive_a_failover():
    res = run_ranks(workers.small_messages_through_failover, 2, {"spin_us": 50}, timeout=120)
    assert all(r["exact"] for r in res) and sum(r["failovers"] for r in res) >= 1, res


def test_size_mismatch_is_a_clear_error_on_every_rank():
    msgs = run_ranks(workers.size_mismatch, 2, {"op_timeout_s": 5.0}, timeout=60)
    for m in msgs:  # both calls named, the same text on every rank
        assert "rank 0 called all_gather(float32[1000])" in m and "rank 1 called all_gather(float32[1010])" in m, m
    assert len(set(msgs)) == 1, msgs
