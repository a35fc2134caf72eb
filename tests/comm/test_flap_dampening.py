"""Flap dampening on loopback rails: a rail that keeps failing is held out, then returns."""

from tests.comm import workers
from tests.comm.harness import run_ranks

HOLD_S = 2.0


def test_a_flapping_rail_is_held_out_and_returns():
    res = run_ranks(workers.flapping_rail_is_held, 2, {"hold_s": HOLD_S}, timeout=180)
    for rank, r in enumerate(res):  # shown when an assertion fails: rail 2's states over time
        print(f"rank {rank} rail 2 (seconds, state, hold reason, failures):", *r.pop("timeline"), sep="\n  ")
        print(f"rank {rank}: all_reduces until each injected failure fired: {r['calls_to_fail']}")
    for r in res:
        assert r["exact"], r
        # One or two failures: back in service as fast as without dampening (probe + handshake).
        assert [state for state, _ in r["readmitted"]] == ["up", "up"], r
        assert all(took < 2.0 for _, took in r["readmitted"]), r
        # The third: held at both ends (one side may only have been told by the other).
        assert r["held"][0] == "held", r
        assert r["hold"]["hold_reason"], r
        assert r["bytes_while_held"] == 0, r  # traffic ran, none of it on the held rail
        assert r["still_held"] == "held", r
        state, took = r["back"]
        assert state == "up" and took < HOLD_S + 2.0, r  # returned by itself when the hold ended
        assert r["bytes_after"] > 0, r
        assert r["held_again"][0] == "held", r
        assert r["restored"][0] == "up" and r["restored"][1] < 2.0, r  # restore ends it at both ends
        assert r["penalty_after_restore"] < 1.0, r
    # Each side judges its own failures: at least one held the rail with a reason that says why,
    # and the second hold was longer (doubled).
    holders = [r for r in res if r["hold"]["hold_left_s"] > 0]
    assert holders, res
    assert all("flapping" in r["hold"]["hold_reason"] and r["hold"]["holds"] >= 1 for r in holders), res
    assert all(r["hold"]["hold_left_s"] <= HOLD_S for r in holders), res
    assert max(r["hold_again_left_s"] for r in res) > HOLD_S, res
    assert sum(r["holds_counter"] for r in res) >= 2, res
