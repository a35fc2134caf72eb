"""The transport's own threads on an idle group (loopback): they must leave the cores alone."""

from tests.comm import workers
from tests.comm.harness import run_ranks


def test_connect_accept_and_writer_threads_sleep_while_idle_and_a_failed_rail_is_still_redialed():
    res = run_ranks(workers.idle_thread_wakeups, 2, {}, timeout=120)
    for rank, r in enumerate(res):
        assert r["exact"], r
        # It polled every 10 ms (about 100 wake-ups a second) with nothing to dial; every
        # wake-up took a core from a spinning caller on a busy host.
        assert r["per_s"]["r2cc-connect"] < 10, r
        # Each rail's accept thread polled every 50 ms; it sleeps until a peer dials or close().
        assert all(n < 10 for name, n in r["per_s"].items() if name.startswith("r2cc-accept")), r
        # An idle rail's writer sleeps: the heartbeat echoes (RTT samples, ~10 a second a rail)
        # go out with the watchdog's pass. Waking the writer for each woke it ~10 times a second
        # a rail, and on a busy host every wake-up preempted some caller.
        assert all(n < 5 for name, n in r["per_s"].items() if name.startswith("r2cc-tx")), r
        # The rail monitor (raised priority) looked at the rails' states every 100 ms itself
        # (10-12 wake-ups a second); the watchdog's passes now look for it and wake it for a
        # change or its 1 s refresh (1-2). Counted are wake-ups, not preemptions (workers.py):
        # the bar sits between the two with room for a busy host's extra GIL waits.
        assert r["per_s"]["r2cc-monitor"] < 7, r
        # ... and the round trips are still measured, less the echo's wait for that pass.
        assert all(0 < rtt < 0.05 for rtt in r["idle_rtt_s"]), r
        # Told of the failure, it dials again at the next probe (rank 1 dials rank 0).
        assert r["rail2"] == "up" and r["reconnects"] >= 1 and r["back_s"] < 3.0, (rank, r)
