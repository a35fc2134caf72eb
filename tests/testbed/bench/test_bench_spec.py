"""Bench input parsing and report arithmetic: pure, no lab, runs anywhere."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from r2cc_testbed.bench import results as report, spec
from r2cc_serve.errors import UserError


def test_sizes_use_binary_units():
    assert spec.parse_sizes("4K,1M,64M") == [4096, 1 << 20, 64 << 20]
    assert spec.parse_sizes("4096, 2k") == [4096, 2048]
    assert spec.format_size(64 << 20) == "64M" and spec.format_size(4100) == "4100"
    for bad in ("", "4Q", "-1K", "0"):
        with pytest.raises(UserError):
            spec.parse_sizes(bad)


def test_op_sizes_must_split_into_float_blocks():
    spec.check_op_size("all_gather", 4096, 4)
    with pytest.raises(UserError, match="multiple of 16"):
        spec.check_op_size("reduce_scatter", 4100, 4)
    with pytest.raises(UserError, match="multiple of 4"):
        spec.check_op_size("all_reduce", 4097, 2)


def test_backends():
    assert spec.parse_backends("r2cc,gloo,mpi") == ["r2cc", "gloo", "mpi"]
    for bad in ("nccl", "r2cc,r2cc", ""):
        with pytest.raises(UserError):
            spec.parse_backends(bad)


def test_the_tcp_floor_is_an_all_reduce_reference_without_faults():
    assert spec.parse_backends("r2cc,tcp-floor") == ["r2cc", "tcp-floor"]
    spec.check_floor(["r2cc", "tcp-floor"], "all_reduce", ["h0:1:down"])  # faults then skip the floor
    with pytest.raises(UserError, match="all_reduce only"):
        spec.check_floor(["tcp-floor"], "all_gather", [])
    with pytest.raises(UserError, match="no failover"):
        spec.check_floor(["tcp-floor"], "all_reduce", ["h0:1:down"])


def test_fault_specs():
    f = spec.parse_fault("h0:1:down@30%", hosts=2, rails=4)
    assert (f.fault.host, f.fault.rail, f.fault.kind, f.at, f.text) == (0, 1, "down", 0.3, "h0:1:down@30%")
    assert spec.parse_fault("h1:rail2:blackhole", 2, 4).at == spec.DEFAULT_FAULT_AT
    assert spec.parse_fault("h0:0:degrade:100mbit@50%", 2, 4).fault.rate == "100mbit"
    flap = spec.parse_fault("h0:3:flap:200:3@10%", 2, 4)
    assert (flap.fault.period_ms, flap.fault.count) == (200, 3)
    assert spec.BenchFault.from_dict(json.loads(json.dumps(flap.to_dict()))) == flap
    gray = spec.parse_fault("h0:1:gray:in:600@50%", 2, 4)
    assert (gray.fault.kind, gray.fault.direction, gray.fault.max_bytes, gray.at) == ("gray", "in", 600, 0.5)
    assert spec.BenchFault.from_dict(json.loads(json.dumps(gray.to_dict()))) == gray
    assert spec.parse_fault("h0:1:marginal:90:out", 2, 4).fault.notation == "h0:1:marginal:90:out"
    held = spec.parse_hold("h0:2:gray", 2, 4).fault  # STEADY_RAIL_FAULTS: held for a whole launch
    assert (held.kind, held.direction, held.max_bytes) == ("gray", "both", 1000)
    assert spec.parse_hold("h0:2:marginal:5", 2, 4).fault.loss_pct == 5
    for bad, msg in [("h2:0:down", "host 2"), ("h0:4:down", "rail 4"), ("h0:0:explode", "kind"),
                     ("h0:0:degrade", "one argument, RATE"), ("h0:0:flap:1", "PERIOD_MS and COUNT"),
                     ("x", "not valid"), ("h0:0:down:7", "no arguments"), ("h0:0:down@30", "share of its duration like @30%"),
                     ("h0:0:down@3s", "share of its duration"), ("h0:0:down@30%+5s", "leave out \\+FOR"),
                     ("h0:0:down@2000%", "between 0% and 1000%"),
                     # what the bench cannot clear by itself afterwards
                     ("h0:0:drain", "cannot be used here"), ("h0:all-down", "cannot be used here"),
                     ("h0:0:clear", "cannot be used here"),
                     ("h0:0:gray:sideways", "gray direction 'sideways' is not valid"),
                     ("h0:0:gray:out:-5@10%", "gray BYTES -5 is not valid"),
                     ("h0:0:marginal:150", "marginal needs a percentage")]:
        with pytest.raises(UserError, match=msg):
            spec.parse_fault(bad, 2, 4)
    with pytest.raises(UserError, match="at least 2 rails"):
        spec.parse_fault("h0:0:down", 2, 1)
    with pytest.raises(UserError, match="--hold-fault 'h0:1:down@30%': @30%: .* whole run; leave out @WHEN"):
        spec.parse_hold("h0:1:down@30%", 2, 4)


def test_busbw_factors_follow_nccl_tests():
    assert report.busbw_factor("all_reduce", 4) == 1.5
    assert report.busbw_factor("all_gather", 4) == 0.75
    assert report.busbw_factor("broadcast", 4) == 1.0


def _entry(times, exact=True):
    return {"times": times, "bit_exact": exact, "close": True, "max_err": 0.0, "rail_tx_bytes": [3, 1],
            "error": None}


def test_iteration_time_is_the_slowest_rank():
    row = report.summarize_measure("gloo", "all_reduce", 2, 1000,
                                   [_entry([1.0, 2.0, 3.0]), _entry([2.0, 1.0, 3.0], exact=False)])
    assert row["p50_s"] == 2.0 and row["busbw_GBps"] == pytest.approx(1000 / 2.0 / 1e9)
    assert row["correct"] and not row["bit_exact"] and row["rail_tx_share"] == [0.75, 0.25]
    r2 = report.summarize_measure("r2cc", "all_reduce", 2, 1000, [_entry([1.0]), _entry([1.0], exact=False)])
    assert not r2["correct"], "r2cc must be bit-exact"
    missing = report.summarize_measure("mpi", "all_reduce", 2, 1000, [_entry([1.0]), None])
    assert not missing["correct"] and "no result" in missing["error"]
    rows = [r2 | {"p50_s": 1.0}, row]
    report.add_ratios(rows)
    assert rows[1]["ratio_vs_r2cc"] == 2.0


def test_tails_need_enough_calls_and_the_table_says_so():
    slow_last = [0.001] * 999 + [0.5]
    row = report.summarize_measure("r2cc", "all_reduce", 2, 1000, [_entry(slow_last), _entry(slow_last)])
    assert row["p50_s"] == 0.001 and row["max_s"] == 0.5 and row["iters"] == 1000
    assert row["p99_s"] == pytest.approx(0.001) and row["p999_s"] > 0.001  # the one slow call shows at p99.9
    assert row["hist"] == {"0.00126": 999, "0.501": 1}
    few = report.summarize_measure("r2cc", "all_reduce", 2, 1000, [_entry([0.001] * 50), _entry([0.001] * 50)])
    assert few["p99_s"] is None and few["p999_s"] is None and few["max_s"] == 0.001
    base = {"op": "all_reduce", "hosts": 2, "rails": 2, "rate": None, "mtu": 1500, "faults": []}
    text = report.table(base | {"iters": 50, "results": [few | {"ratio_vs_r2cc": 1.0}]})
    assert "p99.9 ms" in text and "p99 needs 100 timed calls; p99.9 needs 1000" in text
    assert "needs" not in report.table(base | {"iters": 1000, "results": [row | {"ratio_vs_r2cc": 1.0}]})


def test_slow_calls_say_whether_a_caller_slept_or_lost_its_core():
    times = [0.001] * 198 + [0.5, 0.6]
    kept, slept, preempted = 0, 1, 2
    rank0 = _entry(times) | {"switches": [slept] * 10 + [kept] * 188 + [preempted, kept]}
    rank1 = _entry(times) | {"switches": [kept] * 199 + [slept | preempted]}  # the peer lost its core too
    row = report.summarize_measure("r2cc", "all_reduce", 2, 1000, [rank0, rank1])
    assert row["calls_slept"] == 11 and row["calls_preempted"] == 2
    assert row["slowest_1pct"] == 2 and row["slowest_1pct_preempted"] == 2 and row["slowest_1pct_slept"] == 1
    base = {"op": "all_reduce", "hosts": 2, "rails": 2, "rate": None, "mtu": 1500, "faults": [], "iters": 200}
    assert "slowest 1%: 2/2 a caller preempted, 1 slept" in report.table(base | {"results": [row | {"ratio_vs_r2cc": 1.0}]})
    # Older results without the record (or too few calls for a tail) say nothing rather than 0.
    assert "calls_preempted" not in report.summarize_measure("r2cc", "all_reduce", 2, 1000,
                                                             [_entry(times), _entry(times)])


def test_call_switches_reads_the_thread_s_context_switches():
    from types import SimpleNamespace as R

    from r2cc_testbed.bench.worker import call_switches

    assert call_switches(R(ru_nvcsw=3, ru_nivcsw=5), R(ru_nvcsw=3, ru_nivcsw=5)) == 0
    assert call_switches(R(ru_nvcsw=3, ru_nivcsw=5), R(ru_nvcsw=4, ru_nivcsw=5)) == 1
    assert call_switches(R(ru_nvcsw=3, ru_nivcsw=5), R(ru_nvcsw=3, ru_nivcsw=7)) == 2
    assert call_switches(R(ru_nvcsw=3, ru_nivcsw=5), R(ru_nvcsw=9, ru_nivcsw=6)) == 3


def test_cpu_seconds_per_GB_averages_the_ranks():
    a, b = _entry([1.0, 1.0]) | {"cpu_s": 0.5}, _entry([1.0, 1.0]) | {"cpu_s": 1.5}
    row = report.summarize_measure("mpi", "all_reduce", 2, 10**9, [a, b])
    assert row["cpu_s_per_GB"] == pytest.approx(0.5)  # (0.25 + 0.75) / 2 per GB of each rank's buffer
    assert report.summarize_measure("mpi", "all_reduce", 2, 10**9, [a, _entry([1.0, 1.0])])["cpu_s_per_GB"] is None
    assert "CPU s/GB" in report.table({"op": "all_reduce", "hosts": 2, "rails": 2, "rate": None, "mtu": 1500,
                                       "iters": 2, "results": [row | {"ratio_vs_r2cc": 1.0}], "faults": []})


def test_mean_chunk_is_bytes_per_chunk_over_the_ranks():
    a = _entry([1.0]) | {"chunk_bytes_sent": 3 << 20, "chunks_sent": 3}
    b = _entry([1.0]) | {"chunk_bytes_sent": 1 << 20, "chunks_sent": 4}
    row = report.summarize_measure("r2cc", "all_reduce", 2, 10**6, [a, b])
    assert row["mean_chunk_bytes"] == (4 << 20) // 7
    text = report.table({"op": "all_reduce", "hosts": 2, "rails": 2, "rate": None, "mtu": 1500, "iters": 1,
                         "results": [row | {"ratio_vs_r2cc": 1.0}], "faults": []})
    assert "mean chunk 585K" in text, text
    peer = report.summarize_measure("mpi", "all_reduce", 2, 10**6, [_entry([1.0]), _entry([1.0])])
    assert peer["mean_chunk_bytes"] is None  # a library without chunks shows none


def test_fault_row_extra_time_and_hit():
    entries = [{"completed": True, "elapsed_s": 0.5, "end": 10.0, "bit_exact": True, "resent_bytes": 7},
               {"completed": True, "elapsed_s": 0.6, "end": 10.1, "bit_exact": True, "resent_bytes": 1}]
    inj = {"go": 9.0, "call_start": 9.1, "injected_at": 9.2}
    row = report.summarize_fault("r2cc", "h0:1:down@30%", 1 << 20, entries, inj, 0.4, "R-1")
    assert row["completed"] and row["bit_exact"] and row["hit"] and row["resent_bytes"] == 8
    assert row["extra_s"] == pytest.approx(0.2) and row["fault_at_s"] == pytest.approx(0.2)
    late = report.summarize_fault("r2cc", "x", 1, entries, inj | {"injected_at": 11.0}, 0.4, "R-1")
    assert not late["hit"]
    hung = report.summarize_fault("gloo", "x", 1, [entries[0], None], inj, 0.4, "ff")
    assert not hung["completed"] and hung["hit"] and hung["extra_s"] is None and "no result" in hung["error"]


def test_rate_lists():
    from r2cc_testbed.bench.cli import parse_rates

    assert parse_rates(None) == [None]
    assert parse_rates("1gbit") == ["1gbit"]
    assert parse_rates("250mbit, 1Gbit,unshaped") == ["250mbit", "1gbit", None]
    with pytest.raises(UserError, match="--rate.*fast"):
        parse_rates("250mbit,fast")
    with pytest.raises(UserError, match="twice"):
        parse_rates("1gbit,1gbit")


def test_rate_table_puts_backends_side_by_side():
    def rep(rate, mine, theirs):
        return {"op": "all_reduce", "hosts": 4, "rails": 4, "mtu": 1500, "rate": rate, "results": [
            {"backend": "r2cc", "bytes": 64 << 20, "busbw_GBps": mine, "cpu_s_per_GB": 2.5},
            {"backend": "mpi", "bytes": 64 << 20, "busbw_GBps": theirs, "cpu_s_per_GB": 3.1}]}

    text = report.rate_table([rep("250mbit", 0.114, 0.064), rep("1gbit", 0.2, None), rep(None, 0.5, 0.4)])
    rows = text.splitlines()
    assert "4 hosts x 4 rails" in rows[0] and "r2cc/mpi" in rows[1]
    # 4 rails x 250 Mbit/s = 0.125 GB/s per rank: 0.114 is 91% of it, and 1.78x Open MPI's 0.064
    assert rows[2].split()[:5] == ["250mbit", "64M", "0.125", "0.114", "(91%)"] and rows[2].endswith("1.78x")
    assert rows[3].endswith("-")  # a backend without a figure gives no ratio
    assert rows[4].split()[:4] == ["unshaped", "64M", "-", "0.500"] and rows[4].endswith("1.25x")


def test_spin_lists():
    from r2cc_testbed.bench.cli import parse_spins

    assert parse_spins(None, ["r2cc"]) == [None]
    assert parse_spins("0, 100", ["r2cc", "mpi"]) == [0, 100]
    for bad in ("0,x", "-5", "1.5"):
        with pytest.raises(UserError, match="microseconds"):
            parse_spins(bad, ["r2cc"])
    with pytest.raises(UserError, match="twice"):
        parse_spins("50,50", ["r2cc"])
    with pytest.raises(UserError, match="needs backend r2cc"):
        parse_spins("50", ["mpi"])


def test_spin_table_shows_both_sides():
    def rep(spin, p50, hits, misses, theirs):
        return {"op": "all_reduce", "hosts": 2, "rails": 4, "mtu": 1500, "rate": None, "spin_us": spin, "results": [
            {"backend": "r2cc", "bytes": 4096, "p50_s": p50, "cpu_s_per_GB": 24.0, "spin_hits": hits,
             "spin_misses": misses, "spin_skips": 7},
            {"backend": "mpi", "bytes": 4096, "p50_s": theirs}]}

    rows = report.spin_table([rep(0, 144e-6, 0, 0, 103e-6), rep(100, 100e-6, 314, 49, 150e-6)]).splitlines()
    assert "2 hosts x 4 rails" in rows[0] and "unshaped" in rows[0] and "mpi/r2cc" in rows[1]
    assert rows[2].split() == ["0", "4K", "0.144", "24", "0/0/7", "0.103", "0.72x"]
    assert rows[3].split() == ["100", "4K", "0.100", "24", "314/49/7", "0.150", "1.50x"]



def test_warm_up_runs_until_rank_0_s_time_is_up_and_every_rank_runs_as_many_calls(monkeypatch):
    import threading

    from torch.distributed import HashStore

    from r2cc_testbed.bench import worker
    from r2cc_testbed.bench.worker import warm_up
    from tests.comm.harness import run_in_threads

    # Each rank's own clock, moved only by its calls: the count then follows from the rule, not
    # from how a busy box happens to schedule real sleeps (which made it 36 instead of 40 once).
    clock = threading.local()

    class FakeTime:
        @staticmethod
        def monotonic():
            return getattr(clock, "now", 0.0)

    monkeypatch.setattr(worker, "time", FakeTime)

    class Runner:  # a collective's stand-in: 1/16 s a call on rank 0, twice that on rank 1
        def __init__(self, rank):
            self.rank, self.calls = rank, 0

        def reset(self):
            pass

        def run(self):
            self.calls += 1
            clock.now = getattr(clock, "now", 0.0) + 0.0625 * (1 + self.rank)

    store = HashStore()
    runners = [Runner(0), Runner(1)]
    runs = run_in_threads(lambda r: warm_up(runners[r], 4, 1.0, r, store, "warm/1"))
    # Rank 0 reaches 1 s after 4 batches of 4 calls; rank 1 (2 s by its own clock by then) makes
    # as many, neither fewer (its own time was up after 2 batches) nor more.
    assert runs == [16, 16] and runners[0].calls == runners[1].calls == 16, runs
    assert run_in_threads(lambda r: warm_up(Runner(r), 3, 0.0, r, store, "warm/2")) == [3, 3]  # calls only


def test_a_fresh_group_s_first_calls_are_reported_apart():
    first = [0.004] + [0.001] * 299  # the first call of the group is the slow one
    rows = [report.summarize_measure(b, "all_reduce", 2, 4096,
                                     [_entry([0.001]) | {"first_times": first}, _entry([0.001]) | {"first_times": first}])
            for b in ("r2cc", "mpi")]
    rows[1]["first_calls"]["p50_s"] = 0.002
    assert rows[0]["first_calls"] == {"n": 300, "p50_s": 0.001, "p99_s": pytest.approx(0.001), "max_s": 0.004,
                                      "first_s": 0.004}
    text = "\n".join(report.first_calls_table(rows))
    assert "first calls of a fresh group, before any warm-up (300 calls)" in text, text
    assert text.splitlines()[-1].split() == ["mpi", "4K", "4.000", "2.000", "1.000", "4.000", "2.00"], text
    # Without --first-calls the rows carry none and the table says nothing.
    assert "first_calls" not in report.summarize_measure("r2cc", "all_reduce", 2, 4096, [_entry([1.0])] * 2)
    assert report.first_calls_table([rows[0] | {"first_calls": None}]) == []


def test_first_calls_out_of_range_is_refused():
    for bad in ("-1", "100001"):
        rc = subprocess.run([sys.executable, "-m", "r2cc_serve.cli", "bench", "--first-calls", bad],
                            capture_output=True, text=True, timeout=60)
        assert rc.returncode != 0 and "--first-calls must be between 0 and 100000" in rc.stderr, rc.stderr
        assert "Traceback" not in rc.stderr
