"""What the transport reports about its rails (loopback; no root needed)."""

from tests.comm import workers
from tests.comm.harness import run_ranks


def test_bandwidth_is_measured_on_large_transfers_only():
    res = run_ranks(workers.bandwidth_from_large_transfers_only, 2, {}, timeout=180)
    for r in res:
        assert r["exact"], r
        assert r["chunks_small"] >= 3000, r  # the small messages really went out
        assert r["after_small"] == [0.0] * len(r["after_small"]), r  # not measured from round trips
        assert all(bw > 0 for bw in r["after_large"]), r  # every rail carried stripes and got a figure
