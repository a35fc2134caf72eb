"""The transport's own threads on an idle group (loopback): they must leave the cores alone."""

from tests.comm import workers
from tests.comm.harness import run_ranks


def test_connect_and_accept_threads_sleep_while_idle_and_a_failed_rail_is_still_redialed():
    res = run_ranks(workers.idle_thread_wakeups, 2, {}, timeout=120)
    for rank, r in enumerate(res):
        assert r["exact"], r
        # It polled every 10 ms (about 100 wake-ups a second) with nothing to dial; every
        # wake-up took a core from a spinning caller on a busy host.
        assert r["per_s"]["r2cc-connect"] < 10, r
        # Each rail's accept thread polled every 50 ms; it sleeps until a peer dials or close().
        assert all(n < 10 for name, n in r["per_s"].items() if name.startswith("r2cc-accept")), r
        # Told of the failure, it dials again at the next probe (rank 1 dials rank 0).
        assert r["rail2"] == "up" and r["reconnects"] >= 1 and r["back_s"] < 3.0, (rank, r)
