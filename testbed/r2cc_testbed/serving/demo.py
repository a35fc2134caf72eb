"""`r2cc demo`: a rail dies under a streaming TP=2 vLLM, and nobody notices but the operator.

Steps (each printed as it happens):
  1. lab up: 2 hosts x 4 rails at 1gbit (refuses to touch a lab that is already up)
  2. the tiny float32 model in a temp dir
  3. vLLM on both lab hosts (--nnodes 2), TP=2 across them, --distributed-backend r2cc
  4. a fault-free reference run of the prompts
  5. the same prompts streaming while one rail of host 0 breaks and comes back
  6. report: requests ok/failed, outputs identical?, detect/recover times, bytes per rail
Everything started is stopped and removed on exit, Ctrl-C or error (--keep-lab keeps the lab).
"""

from __future__ import annotations

import contextlib
import signal
import sys

from r2cc_serve.errors import UserError
from r2cc_testbed.faults.model import HELD_KINDS
from r2cc_testbed.serving import vllm_env
from r2cc_testbed.serving.deploy import two_nodes
from r2cc_testbed.serving.fault_experiment import FAULT_HELP, options_given, parse_option
from r2cc_testbed.lab.session import lab_session
from r2cc_testbed.serving.load import LoadSpec, run_load
from r2cc_testbed.serving.model_dir import temp_model
from r2cc_testbed.serving.fault_experiment import run_with_fault
from r2cc_serve.util.durations import millis, seconds


def _say(msg: str) -> None:
    print(f"[demo] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """`kill <demo>` cleans up like Ctrl-C instead of leaving vLLM and the lab behind."""
    def handler(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _or(value, default):
    return default if value is None else value


def run(args) -> int:
    given = options_given(args, {"rail": "--rail", "after": "--after", "hold": "--hold"})
    fault = parse_option(args.fault or "down", host=0, rail=_or(args.rail, 0), after_s=_or(args.after, 3.0),
                         hold_s=_or(args.hold, 5.0), given=given)
    if fault.is_admin and args.backend != "r2cc":
        raise UserError(f"--fault {fault.kind} needs --backend r2cc (it goes through r2cc's control agents)")
    spec = LoadSpec(max_tokens=args.max_tokens, concurrency=args.concurrency,
                    request_timeout_s=args.request_timeout, deadline_s=args.request_timeout + 120)
    with _sigterm_as_interrupt():
        _say("1/6 lab: 2 hosts x 4 rails at 1gbit")
        with lab_session(2, 4, "1gbit", keep=args.keep_lab) as lab:
            _say(f"    lab {lab.prefix}: hosts {lab.host_ns(0)}, {lab.host_ns(1)}; management {lab.mgmt_ip(0)}, "
                 f"{lab.mgmt_ip(1)}")
            _say("2/6 model")
            with temp_model("float32") as model:
                _say(f"3/6 vLLM TP=2 on two nodes, backend {args.backend} (1-3 min on a small box)")
                with two_nodes(lab, model, backend=args.backend, port=args.port,
                               extra_args=("--dtype", "float32")) as dep:
                    _say(f"4/6 fault-free reference: {len(spec.prompts)} prompts x {spec.max_tokens} tokens")
                    ref = run_load(dep.url, dep.model, spec)
                    if ref.failed:
                        raise UserError(f"the fault-free run already failed: {ref.failed[0].error}")
                    _say(f"5/6 streaming again; {fault.text}")
                    out = run_with_fault(dep, fault, spec, ref, progress=lambda m: _say("    " + m))
                    _say("6/6 report")
                    _report(args, lab, out)
    if args.keep_lab:
        _say(f"the lab {lab.prefix} is still up (--keep-lab); `r2cc lab down` removes it")
    return 0 if vllm_env.is_default(args.backend) or not out.problems() else 1


def _report(args, lab, out) -> None:
    s = out.summary()
    rec = out.record
    print(f"\nr2cc demo: vLLM TP=2 over 2 lab hosts x 4 rails (1gbit), backend {args.backend}")
    print(f"fault          : {out.spec.text}")
    print(f"requests       : {s['ok']}/{s['requests']} ok, {s['failed']} failed"
          + (f" ({s['errors'][0]})" if s["errors"] else ""))
    same = "yes" if not out.mismatches else f"NO ({len(out.mismatches)} differ: {out.mismatches[0]})"
    print(f"outputs        : identical to the fault-free reference: {same}")
    print(f"while broken   : {out.tokens_during_fault} tokens streamed; "
          f"vLLM /health {_mid(rec.mid_fault, 'vllm_health')}; r2cc health {_health(rec.mid_fault)}")
    print(f"inter-token    : p50 {millis(s['itl_p50_s'])}, p99 {millis(s['itl_p99_s'])}, max {millis(s['itl_max_s'])}")
    if vllm_env.is_default(args.backend):
        # vLLM's gloo path has no failover: it fails or waits for the kernel's TCP retransmits
        # (over MPTCP, for the kernel to move the data to another subflow).
        stalled = f"decoding stalled up to {s['itl_max_s']:.1f} s" if s["itl_max_s"] else "no tokens"
        print(f"verdict        : default backend: {s['failed']} failed, {stalled}, "
              f"{out.tokens_during_fault} tokens while the rail was broken (compare with --backend r2cc)")
        return
    print(f"detect         : {seconds(out.detect_s)} after the fault (core detection latency {seconds(out.core_detect_s)})")
    print(f"recover        : {seconds(out.recover_s)} after the restore (rail back in service: "
          f"{'yes' if out.recovered else 'no'})")
    if out.status_delta:
        print("bytes per rail : " + ", ".join(
            f"{'mgmt0(fallback)' if v.get('fallback') else lab.rail_ifname(k)} {v['bytes_sent'] / 1e6:.2f} MB"
            f"{' (' + str(v['chunks_resent']) + ' chunks re-sent)' if v['chunks_resent'] else ''}"
            for k, v in sorted(out.status_delta.items())))
    if out.noise:
        print(f"note           : {len(out.noise)} state changes on rails that were not broken "
              "(false alarms from CPU starvation on a busy box; lossless, but they cost re-sends)")
    problems = out.problems()
    print("verdict        : " + ("lossless failover, no request noticed" if not problems else "; ".join(problems)))


def _mid(mid, key):
    return mid.get(key, "?") if isinstance(mid, dict) else "?"


def _health(mid) -> str:
    if not isinstance(mid, dict) or not mid.get("r2cc"):
        return "? (no r2cc status files)"
    return ", ".join(f"{rank} {v.get('status')}" for rank, v in sorted(mid["r2cc"].items()))




def add_arguments(p) -> None:
    p.add_argument("--backend", choices=vllm_env.BACKENDS, default="r2cc",
                   help="r2cc (default), or vLLM's own backend with gloo on rail0 (default), a gloo device per "
                        "rail (default-rails) or rail0 under kernel MPTCP with a subflow per rail (default-mptcp)")
    p.add_argument("--fault", metavar="FAULT",
                   help=f"what breaks, when and for how long, {FAULT_HELP}, e.g. h0:1:degrade:100mbit@3s+10s; "
                        f"kinds {', '.join(HELD_KINDS)} (default h0:0:down@3s+5s: rail 0 of host 0, the rail every "
                        "backend uses, gloo's only one and MPTCP's first subflow). The older form KIND[:ARGS] with "
                        "--rail, --after and --hold still works")
    p.add_argument("--rail", type=int, default=None, help="with the older --fault KIND: rail of host 0 (default 0)")
    p.add_argument("--after", type=float, default=None, help="with the older --fault KIND: seconds into the stream "
                                                             "(default 3)")
    p.add_argument("--hold", type=float, default=None, help="seconds the fault lasts, when --fault has no +SECONDS "
                                                            "(default 5)")
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--request-timeout", type=float, default=120.0,
                   help="seconds a request may take before it counts as failed (default 120)")
    p.add_argument("--port", type=int, default=8000, help="vLLM's API port on the lab's host 0 (default 8000)")
    p.add_argument("--keep-lab", action="store_true", help="leave the lab up afterwards")
