"""GET /r2cc/v1/plan's content from the rank agents' states (pure), and `r2cc rails`'s line for it."""

from r2cc_serve.admin.render import render_plans
from r2cc_serve.admin.snapshot import group_plans


def _state(host, plan):
    return {"host": host, "plan": plan}


def test_one_entry_per_group_with_each_ranks_bandwidth_and_agreement():
    plan = {"schedule": "auto", "epoch": 3, "bandwidth_Bps": {"out": [4e8, 4e8, 2e8], "in": [4e8, 4e8, 2e8]},
            "choices": [{"op": "all_reduce", "size_bucket_bytes": 64 << 20, "elem_bytes": 4, "schedule": "optcc",
                         "chunks": 64, "estimate_s": 1.1}]}
    states = {("tp", 0): _state("h0", plan), ("tp", 1): _state("h1", plan), ("tp", 2): _state("h2", dict(plan, epoch=2)),
              ("pp", 0): _state("h0", {"schedule": "auto"}), ("pp", 1): _state("h1", None)}
    by_group = {g["group"]: g for g in group_plans(states)}
    tp = by_group["tp"]
    assert tp["schedule"] == "auto" and tp["epoch"] == 3 and not tp["agreed"]  # rank 2 is a table behind
    assert [(r["host"], r["bandwidth_Bps"]) for r in tp["ranks"]] == [("h0", 4e8), ("h1", 4e8), ("h2", 2e8)]
    assert by_group["pp"]["epoch"] is None and by_group["pp"]["agreed"]  # built-in path: no table
    line = render_plans([tp, by_group["pp"]])
    assert "plan tp: auto, table 3 (ranks not yet agreed): 381.5MiB/381.5MiB/190.7MiB per s" in line, line
    assert "64.0MiB->optcc/K64" in line and "plan pp: auto" in line, line
