"""Decode throughput and TPOT of a TP=2 deployment: r2cc vs vLLM's default backend, same run.

    r2cc serve-bench [--shape two-nodes] [--duration 30] [--rounds 3] [--fault down]
    r2cc serve-bench --backends default,default-rails,default-mptcp,r2cc --rounds 1 --cycles 3

For each backend in turn (default first, then r2cc) one deployment of the same shape is
started on the same lab; after a warm-up, `rounds` closed-loop load rounds of `duration`
seconds run (`concurrency` streams, greedy, `max_tokens` each) and the median round is
reported. `--cycles N` runs the whole list N times on fresh deployments, so the backends
alternate and share the shared box's drifts. vLLM's default backend comes in three wirings
(vllm_env.py): one rail, a gloo device per rail, MPTCP over every rail. Then,
on the r2cc deployment only (the default backend is fail-stop: a dead rail hangs it), one
more round runs with a rail fault in its middle third, and the inter-token p99 inside the
fault window is compared with the fault-free rounds. The machine's load average is
recorded next to every number: these boxes are shared.

Every worker of every backend also times its decode steps and the collectives inside them, the
same way (R2CC_STEP_SHARE_DIR, r2cc_serve/vllm/step_share.py): SHARE_HELP says what is printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys

from r2cc_serve.errors import UserError
from r2cc_serve.util.rates import check_lab_rate
from r2cc_testbed.results import add_out_argument, check_out, write_result
from r2cc_serve.health.monitor import SPIN_COUNTERS, spin_waits
from r2cc_testbed.faults.model import HELD_KINDS, FaultSpec
from r2cc_testbed.serving import evidence, vllm_env
from r2cc_testbed.serving.deploy import single_instance, two_nodes
from r2cc_testbed.serving.fault_experiment import FAULT_HELP, options_given, parse_option
from r2cc_testbed.lab.session import lab_session
from r2cc_testbed.serving.load import LoadSpec, percentile, compare, run_load
from r2cc_testbed.serving.model_dir import temp_model
from r2cc_testbed.serving.procs import sessions_cpu_s
from r2cc_testbed.serving.fault_experiment import run_with_fault
from r2cc_serve.util.durations import millis
from r2cc_serve.vllm import step_share

ROUND_KEYS = ("tokens_per_s", "tpot_p50_s", "tpot_p99_s", "itl_p50_s", "itl_p99_s", "itl_max_s", "cpu_s_per_token")
SHARE_HELP = (
    "The share of a decode step spent in collectives (eager mode): each worker, whatever the backend, times "
    "vLLM's collective calls (GroupCoordinator all_reduce, all_gather, gather, ...) from entry to return inside "
    "its decode steps (execute_model + sample_tokens; steps with a prompt chunk are left out) with the same "
    "clocks. Printed per backend and rank (each figure the median of the rounds): collective calls per step, "
    "wall ms inside them and in the whole step, and their share of the step's wall time, of the calling "
    "thread's CPU time and of the worker process's CPU time (helper threads too: r2cc's rail threads, the gloo "
    "process group's worker threads). The wall share bounds what any faster communicator could save of a step "
    "(it includes waiting for the other rank); the rest is the worker's own compute. The engine's time between "
    "steps is in neither. The clocks cost a few us per call, printed as a share of the step. Not measured with "
    "--compile.")
SHARE_KEYS = ("steps", "calls_per_step", "coll_s_per_step", "step_s", "coll_cpu_s_per_step", "step_cpu_s",
              "coll_proc_cpu_s_per_step", "step_proc_cpu_s", "wall_share", "cpu_share", "proc_cpu_share")
NO_SHARE_UNDER_COMPILE = ("not measured with --compile: vLLM's own backend is traced into the graph there, out of "
                          "the clocks' reach")


def _say(msg: str) -> None:
    print(f"[serve-bench] {msg}", file=sys.stderr, flush=True)


def _loadavg() -> float:
    return round(os.getloadavg()[0], 2)


def _tx_bytes(lab) -> dict[str, int]:
    """Bytes sent by host 0 per interface (rails and mgmt): where each backend's traffic really went."""
    from r2cc_testbed.lab import netns

    out = {}
    for link in netns.ip_json(lab.host_ns(0), "-s", "link", "show"):
        if link["ifname"] != "lo":
            out[link["ifname"]] = int(link.get("stats64", link.get("stats", {})).get("tx", {}).get("bytes", 0))
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", choices=["two-nodes", "single"], default="two-nodes",
                   help="two-nodes: one vLLM node per lab host (default); single: one vLLM, rails in lab hosts")
    p.add_argument("--backends", default="default,r2cc",
                   help=f"comma list of {', '.join(vllm_env.BACKENDS)}, run in this order (default: default,r2cc). "
                        "default: vLLM's own backend with gloo on rail0, as a user configures it; default-rails: a "
                        "gloo device per rail; default-mptcp: rail0 under kernel MPTCP with a subflow per rail "
                        "(the last two: two-nodes only). They are the gloo, gloo-rails and gloo-mptcp of r2cc bench, "
                        "inside vLLM")
    p.add_argument("--cycles", type=int, default=1,
                   help="run the whole backend list this many times, each time on a fresh deployment, so the "
                        "backends alternate through the box's drifts; medians are over every round (default 1)")
    p.add_argument("--duration", type=float, default=30.0, help="seconds per load round (default 30)")
    p.add_argument("--rounds", type=int, default=3, help="fault-free rounds per backend; the median is reported")
    p.add_argument("--concurrency", type=int, default=4, help="streams in flight (default 4)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per request (default 64)")
    p.add_argument("--fault", metavar="FAULT",
                   help=f"fault of the extra r2cc round, {FAULT_HELP}; without @ and + it breaks the rail in the "
                        f"round's middle third. Kinds {', '.join(HELD_KINDS)}, e.g. h0:1:degrade:100mbit; none skips "
                        "the round (default h0:1:down). The older KIND[:ARGS] with --fault-host and --fault-rail "
                        "still works")
    p.add_argument("--fault-host", type=int, default=None, help="with the older --fault KIND: host (default 0)")
    p.add_argument("--fault-rail", type=int, default=None, help="with the older --fault KIND: rail (default 1)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="model dtype; float32 keeps greedy outputs batch-invariant so they can be compared")
    p.add_argument("--compile", action="store_true", help="torch.compile mode (no --enforce-eager); slower start")
    p.add_argument("--rate", default="1gbit", help="rail shaping of the lab: a tc rate, or unshaped for "
                                                     "rails as fast as this CPU (default 1gbit)")
    p.add_argument("--port", type=int, default=8400, help="vLLM's API port (default 8400)")
    p.add_argument("--vllm-arg", action="append", default=[], metavar="ARG",
                   help="extra `vllm serve` argument, repeatable (e.g. --vllm-arg=--max-num-seqs=1)")
    add_out_argument(p, "serve-bench")
    p.add_argument("--keep-lab", action="store_true", help="leave the lab up afterwards")


def _rail_health(before: dict, dep) -> dict:
    """r2cc only: rails failed over and bytes sent on fallback rails during a round (both 0
    without a fault: a busy CPU must not look like a broken network)."""
    status = evidence.read_status_now(dep.status_dir)
    delta = evidence.diff_totals(before["rails"], evidence.rail_totals(status))
    if not delta:
        return {}
    out = {"rail_failovers": sum(t["failovers"] for t in delta.values()),
           "fallback_bytes": sum(t["bytes_sent"] for t in delta.values() if t["fallback"])}
    spins = spin_waits(status.values())
    if spins:
        # Whether waits spun during the round or the CPU-pressure gate kept them asleep.
        out["spins"] = {k: spins[k] - before["spins"].get(k, 0) for k in SPIN_COUNTERS}
        out["spins"]["cpu_pressure_last"] = round(spins["cpu_pressure"], 3)
    return out


def run(args) -> int:
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or len(set(backends)) != len(backends):
        raise UserError(f"--backends {args.backends!r}: a comma list of {', '.join(vllm_env.BACKENDS)}, "
                        "each at most once")
    shape = "single" if args.shape == "single" else None
    for b in backends:
        vllm_env.check_backend(b, shape)
    if args.duration <= 0 or args.rounds < 1 or args.concurrency < 1 or args.max_tokens < 2 or args.cycles < 1:
        raise UserError("--duration > 0, --rounds >= 1, --cycles >= 1, --concurrency >= 1 and --max-tokens >= 2 "
                        "are needed")
    check_out(args.out, "serve-bench")
    third = args.duration / 3  # the fault round breaks the rail in its middle third
    given = options_given(args, {"host": "--fault-host", "rail": "--fault-rail"})
    fault = None if args.fault == "none" else parse_option(
        args.fault or "down", host=0 if args.fault_host is None else args.fault_host,
        rail=1 if args.fault_rail is None else args.fault_rail, after_s=third, hold_s=third, given=given)
    spec = LoadSpec(max_tokens=args.max_tokens, concurrency=args.concurrency, duration_s=args.duration,
                    request_timeout_s=max(120.0, args.duration * 4), deadline_s=args.duration * 4 + 300)
    result = {"shape": args.shape, "rate": args.rate, "dtype": args.dtype, "compile": args.compile,
              "cycles": args.cycles, "spec": dataclasses.asdict(spec), "cpus": os.cpu_count(), "backends": {}}
    if args.compile:
        result["step_share"] = NO_SHARE_UNDER_COMPILE
    deploy = two_nodes if args.shape == "two-nodes" else single_instance
    with lab_session(2, 4, check_lab_rate(args.rate), keep=args.keep_lab) as lab, temp_model(args.dtype) as model:
        ref, runs = None, {b: [] for b in backends}
        for cycle in range(1, args.cycles + 1):
            for backend in backends:
                entry = result["backends"].setdefault(backend, {"startup_s": [], "warmup_s": [], "rounds": []})
                where = f" (cycle {cycle}/{args.cycles})" if args.cycles > 1 else ""
                _say(f"{backend}: starting the {args.shape} deployment{where} (load average {_loadavg()})")
                with deploy(lab, model, backend=backend, port=args.port, enforce_eager=not args.compile,
                            extra_args=("--dtype", args.dtype, *args.vllm_arg), step_share=not args.compile) as dep:
                    entry["startup_s"].append(round(dep.startup_s, 1))
                    entry["warmup_s"].append(round(dep.warmup_s, 1))
                    for i in range(args.rounds):
                        r, s = _round(dep, lab, spec, backend)
                        s["cycle"] = cycle
                        runs[backend].append(r)
                        entry["rounds"].append(s)
                        _say(f"{backend}{where} round {i + 1}/{args.rounds}: {s['tokens_per_s']} tok/s, "
                             f"{s['cpu_s_per_token'] * 1000:.0f} ms CPU per token, TPOT p50 "
                             f"{millis(s['tpot_p50_s'])} p99 {millis(s['tpot_p99_s'])}, ITL p99 {millis(s['itl_p99_s'])} "
                             f"max {millis(s['itl_max_s'])}, {s['failed']} failed (load {s['loadavg_before']})"
                             + (f"; rail failovers {s['rail_failovers']}, fallback bytes {s['fallback_bytes']}"
                                + _spin_text(s.get("spins")) if backend == "r2cc" else "")
                             + _share_text(s.get("step_share")))
                    if ref is None:
                        ref = runs[backend][0]
                    if backend == "r2cc" and fault is not None and cycle == args.cycles:
                        entry["fault"] = _fault_round(dep, fault, spec, runs[backend][0])
        for backend, entry in result["backends"].items():
            _summarize(entry, runs[backend], ref, first=backend == backends[0])
    _print(result)
    if args.out:
        _say(f"wrote {write_result(args.out, 'serve-bench', result)}")
    return 0


def _round(dep, lab, spec: LoadSpec, backend: str):
    """One load round on a deployment: the client's result and its summary with CPU, traffic per
    interface and (r2cc) rail health."""
    load_before = _loadavg()
    tx_before = _tx_bytes(lab)
    status = evidence.read_status_now(dep.status_dir)
    health_before = {"rails": evidence.rail_totals(status), "spins": spin_waits(status.values())}
    sids = [p.sid for p in dep.procs]
    cpu_before = sessions_cpu_s(sids)
    steps_before = step_share.read_dir(dep.step_share_dir)
    r = run_load(dep.url, dep.model, spec)
    cpu_s = sessions_cpu_s(sids) - cpu_before
    steps = step_share.window(steps_before, step_share.read_dir(dep.step_share_dir))
    tx = {k: v - tx_before.get(k, 0) for k, v in _tx_bytes(lab).items()}
    s = r.summary()
    # Every process of the deployment (API server, engine, workers): what a token costs in
    # CPU, the transport's share included.
    s.update(loadavg_before=load_before, loadavg_after=_loadavg(), host0_tx_bytes=tx,
             cpu_s=round(cpu_s, 2), cpu_s_per_token=round(cpu_s / max(s["tokens"], 1), 4),
             **_rail_health(health_before, dep))
    if dep.step_share_dir:
        s["step_share"] = steps  # per rank: decode steps and all steps (step_share.per_step)
    return r, s


def _spin_text(spins: dict | None) -> str:
    if not spins:
        return ""
    return (f"; waits spun {spins['spin_hits'] + spins['spin_misses']} ({spins['spin_hits']} got their bytes), "
            f"{spins.get('spin_briefs', 0)} of them only briefly, the CPU being wanted; "
            f"slept at once {spins['spin_skips']} (CPU pressure {spins['cpu_pressure_last']:.2f})")


def _summarize(entry: dict, runs: list, ref, first: bool) -> None:
    entry["median"] = {k: statistics.median(x[k] for x in entry["rounds"] if x[k] is not None)
                       for k in ROUND_KEYS}
    shares = median_step_share([r["step_share"] for r in entry["rounds"] if r.get("step_share")])
    if shares:
        entry["step_share"] = shares
    # vLLM's greedy output may depend on batch composition; rounds of one backend against each
    # other show how much (the floor for the cross-backend count).
    self_diff = [m for r in runs[1:] for m in compare(runs[0], r)]
    entry["self_mismatches"], entry["self_mismatch_examples"] = len(self_diff), self_diff[:3]
    if not first:
        cross = [m for r in runs for m in compare(ref, r)]
        entry["mismatches_vs_first_backend"], entry["mismatch_examples"] = len(cross), cross[:3]


def median_step_share(rounds: list[dict]) -> dict:
    """Per rank, the median over rounds of each decode-step figure (SHARE_KEYS) and of the
    worker's overhead per timed call."""
    out = {}
    for rank in sorted({k for r in rounds for k in r}, key=int):
        mine = [r[rank] for r in rounds if rank in r]

        def median(values):
            values = [v for v in values if v is not None]
            return statistics.median(values) if values else None

        out[rank] = {"decode": {k: median(m["decode"][k] for m in mine) for k in SHARE_KEYS},
                     "overhead_us_per_call": median(m["overhead_us_per_call"] for m in mine)}
    return out


def _share_text(shares: dict | None) -> str:
    """The round's line: each rank's wall share of a decode step inside collectives."""
    if not shares:
        return ""
    return "; in collectives " + ", ".join(
        f"rank {rank} {_pct(v['decode']['wall_share'])} of a decode step" for rank, v in shares.items())


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.1f}%"


def share_lines(result: dict) -> list[str]:
    """The step-share table: per backend and rank, inside collectives per decode step."""
    if isinstance(result.get("step_share"), str):
        return [f"Collective share of a decode step: {result['step_share']}"]
    rows = [(name, rank, v) for name, e in result["backends"].items()
            for rank, v in (e.get("step_share") or {}).items()]
    if not rows:
        return []
    lines = ["Inside collectives per decode step, per worker (every backend timed alike in the worker: "
             "vLLM's collective calls, from entry to return; each figure the median of the rounds):",
             f"{'backend':14} {'rank':>4} {'steps':>6} {'calls':>6} {'in coll.':>9} {'step':>9} {'wall':>6} "
             f"{'CPU thr':>7} {'CPU proc':>8}  clocks' cost"]
    for name, rank, v in rows:
        d = v["decode"]
        cost = v["overhead_us_per_call"]
        cost_text = "-" if cost is None or not d["calls_per_step"] or not d["step_s"] else \
            f"{cost:.1f} us/call, {cost * 1e-6 * d['calls_per_step'] / d['step_s'] * 100:.2f}% of a step"
        lines.append(f"{name:14} {rank:>4} {d['steps'] or 0:>6.0f} {d['calls_per_step'] or 0:>6.1f} "
                     f"{millis(d['coll_s_per_step'], 2):>9} {millis(d['step_s'], 2):>9} {_pct(d['wall_share']):>6} "
                     f"{_pct(d['cpu_share']):>7} {_pct(d['proc_cpu_share']):>8}  {cost_text}")
    lines.append("calls: collective calls per decode step; in coll., step: wall time inside them and in the whole "
                 "step; wall, CPU thr, CPU proc: their share of the step's wall time, of its thread's CPU time and of "
                 "the worker process's CPU time (what they mean: r2cc serve-bench --help)")
    return lines


def _fault_round(dep, fault: FaultSpec, spec: LoadSpec, reference) -> dict:
    load_before = _loadavg()
    out = run_with_fault(dep, fault, spec, reference)  # runs for the fault window + 3 s
    rec = out.record
    s = out.summary()
    in_window = out.load.gaps(rec.injected_at, rec.restored_at) if rec.injected_at else []
    s.update(loadavg_before=load_before, loadavg_after=_loadavg(), problems=out.problems(),
             itl_p99_in_fault_window_s=percentile(in_window, 99), itl_p50_in_fault_window_s=percentile(in_window, 50),
             gaps_in_fault_window=len(in_window))
    _say(f"r2cc with {fault.text}: ITL p99 in the fault window {millis(s['itl_p99_in_fault_window_s'])}, "
         f"{s['failed']} failed, {s['mismatches']} mismatches, detect {s['detect_s']} s, recover {s['recover_s']} s")
    return s



def _print(result: dict) -> None:
    b = result["backends"]
    rounds = len(next(iter(b.values()))["rounds"])
    cycles = f" in {result['cycles']} alternating cycles" if result.get("cycles", 1) > 1 else ""
    print(f"\nTP=2 {result['shape']}, rails 4 x {result['rate']}, {result['dtype']}, "
          f"{'compile' if result['compile'] else 'eager'}, {result['spec']['concurrency']} streams x "
          f"{result['spec']['max_tokens']} tokens, {rounds} rounds x {result['spec']['duration_s']:.0f} s per backend"
          f"{cycles} (median round)")
    print(f"{'backend':14} {'tok/s':>8} {'CPU/token':>9} {'TPOT p50':>9} {'TPOT p99':>9} {'ITL p50':>8} "
          f"{'ITL p99':>8} {'ITL max':>8}  tok/s of rounds; load avg")
    for name, e in b.items():
        m = e["median"]
        loads = [r["loadavg_before"] for r in e["rounds"]]
        each = "/".join(f"{r['tokens_per_s']:.0f}" for r in e["rounds"])
        print(f"{name:14} {m['tokens_per_s']:8.2f} {millis(m['cpu_s_per_token']):>9} {millis(m['tpot_p50_s']):>9} "
              f"{millis(m['tpot_p99_s']):>9} {millis(m['itl_p50_s']):>8} {millis(m['itl_p99_s']):>8} "
              f"{millis(m.get('itl_max_s')):>8}  {each}; {min(loads)}-{max(loads)}")
    for name, e in b.items():
        tx = e["rounds"][-1]["host0_tx_bytes"]
        print(f"{name}: host 0 sent per interface in the last round: "
              + ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in sorted(tx.items())))
    for line in ratio_lines(b):
        print(line)
    for line in share_lines(result):
        print(line)
    for name, e in b.items():
        print(f"{name}: requests whose tokens differ from round 1 of the same backend: {e['self_mismatches']}"
              + (f"; from round 1 of {next(iter(b))}: {e['mismatches_vs_first_backend']}"
                 if "mismatches_vs_first_backend" in e else ""))
    f = b.get("r2cc", {}).get("fault")
    if f:
        print(f"r2cc with {f['fault']}: {f['ok']}/{f['requests']} ok, {f['mismatches']} mismatches, "
              f"ITL p99 in fault window {millis(f['itl_p99_in_fault_window_s'])} vs fault-free "
              f"{millis(b['r2cc']['median']['itl_p99_s'])}; whole round TPOT p99 {millis(f['tpot_p99_s'])}; "
              f"detect {f['detect_s']} s, recover {f['recover_s']} s")


def ratio_lines(backends: dict) -> list[str]:
    """r2cc against every other backend (tok/s and CPU per token, median rounds), then against
    the best of them: the figure a headline may quote."""
    if "r2cc" not in backends or len(backends) < 2:
        return []
    mine = backends["r2cc"]["median"]
    others = {k: v["median"] for k, v in backends.items() if k != "r2cc"}
    lines = [f"r2cc / {k}: decode tokens/s {mine['tokens_per_s'] / max(m['tokens_per_s'], 1e-9):.2f}x, "
             f"CPU per token {mine['cpu_s_per_token'] / max(m['cpu_s_per_token'], 1e-9):.2f}x"
             for k, m in others.items()]
    best = max(others, key=lambda k: others[k]["tokens_per_s"])
    lines.append(f"r2cc against the fastest baseline ({best}): "
                 f"{mine['tokens_per_s'] / max(others[best]['tokens_per_s'], 1e-9):.2f}x decode tokens/s")
    return lines
