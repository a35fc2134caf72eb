"""`vllm bench serve`'s command line and result file; the fault daemon's step plan. Pure."""

from __future__ import annotations

import dataclasses

from r2cc_testbed.faults.model import FaultSchedule
from r2cc_testbed.loadtest.bench_serve import bench_argv, parse_result
from r2cc_testbed.faults.schedule import expand
from r2cc_testbed.loadtest.scenario import Load


def _argv(**kw):
    args = dict(url="http://10.0.0.1:8000", model_dir="/m", served_name="tiny", load=Load(concurrency=4, requests=8),
                num_prompts=8, request_rate=None, concurrency=4, result_dir="/out", result_file="r.json")
    return bench_argv(**{**args, **kw})


def test_bench_argv_is_greedy_seeded_and_detailed():
    argv = _argv()
    assert argv[:3] == ["vllm", "bench", "serve"]
    for flag in ("--ignore-eos", "--save-result", "--save-detailed", "--disable-tqdm"):
        assert flag in argv
    pairs = dict(zip(argv, argv[1:]))
    assert pairs["--temperature"] == "0" and pairs["--seed"] == "0" and pairs["--request-rate"] == "inf"
    assert pairs["--max-concurrency"] == "4" and pairs["--dataset-name"] == "random"
    assert pairs["--percentile-metrics"] == "ttft,tpot,itl,e2el" and pairs["--metric-percentiles"] == "50,90,99"
    assert pairs["--tokenizer"] == "/m" and pairs["--served-model-name"] == "tiny"


def test_bench_argv_open_loop_and_local_dataset():
    load = Load(dataset="/data/p.jsonl", request_rate=1.5, duration_s=10, output_len=12)
    argv = _argv(load=load, request_rate=1.5, concurrency=None)
    assert "--max-concurrency" not in argv and "--skip-chat-template" in argv
    pairs = dict(zip(argv, argv[1:]))
    assert pairs["--request-rate"] == "1.5" and pairs["--custom-output-len"] == "12"
    assert pairs["--dataset-name"] == "custom" and pairs["--dataset-path"] == "/data/p.jsonl"


def test_parse_result_aligns_times_and_keeps_failures():
    doc = {"start_times": [100.5, 101.0, 102.0], "ttfts": [0.2, 0.0, 0.3], "itls": [[0.1, 0.1], [], [0.2, 0.2]],
           "latencies": [0.4, 0.0, 0.7], "generated_texts": ["ab", "", "cd"], "output_lens": [3, 0, 3],
           "errors": ["", "Traceback...\naiohttp.ClientOSError: [Errno 104] reset", ""],
           "request_throughput": 1.2, "completed": 2}
    reqs, summary = parse_result(doc, t0=100.0)
    assert [r.ok for r in reqs] == [True, False, True]
    assert reqs[0].sent_s == 0.5 and abs(reqs[0].tpot_s - 0.1) < 1e-9
    assert reqs[1].error == "aiohttp.ClientOSError: [Errno 104] reset" and reqs[1].tpot_s is None
    assert [round(t, 3) for t in reqs[2].token_times_s()] == [2.5, 2.7]
    assert summary["request_throughput"] == 1.2


def test_a_flap_is_planned_as_down_up_pairs_on_its_period():
    sched = FaultSchedule.parse([{"at": 1, "do": "h0:3:flap:100:3"}, {"at": 1.05, "do": "h1:all-down"},
                                 {"at": 2, "do": "h0:3:clear"}])
    steps = expand(list(sched.entries))
    flap = [s for s in steps if s.entry == 0]
    assert [(s.kind, round(s.at_s, 3)) for s in flap] == [("down", 1.0), ("up", 1.05), ("down", 1.1), ("up", 1.15),
                                                          ("down", 1.2), ("up", 1.25)]
    assert [s.at_s for s in steps] == sorted(s.at_s for s in steps)
    all_down = next(s for s in steps if s.entry == 1)
    assert (all_down.kind, all_down.rail, all_down.label) == ("all-down", None, "all-down h1 all rails")
    assert steps[-1].kind == "clear" and flap[0].label == "flap 1/3 down h0 rail3"


def test_degrade_carries_its_rate():
    (step,) = expand([dataclasses.replace(FaultSchedule.parse([{"at": 0, "do": "h0:1:degrade:250mbit"}]).entries[0])])
    assert (step.kind, step.rate) == ("degrade", "250mbit")


def test_line_reader_never_waits_past_its_timeout():
    # The fault daemon's stdin and its tc batch processes are read through it: a silent peer
    # must cost a bounded wait, and an ended one must be told apart from a slow one.
    import os
    import time

    from r2cc_testbed.faults.inprocess_executor import LineReader

    r, w = os.pipe()
    reader = LineReader(r)
    t0 = time.monotonic()
    assert reader.next(0.05) is None and not reader.eof and time.monotonic() - t0 < 1.0
    os.write(w, b"one\ntwo")
    assert reader.next(0.05) == "one"
    os.close(w)
    assert reader.next(0.05) is None and reader.eof  # "two" never got its newline
    os.close(r)
