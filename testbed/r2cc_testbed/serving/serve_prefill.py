"""Long-prompt prefill under a degraded host: the schedule planner against forced direct.

    r2cc serve-prefill [--tp 4] [--schedules auto,direct] [--fault h3:2:down --fault h3:3:down]

A prefill all-reduces [prompt tokens, hidden] activations (about 2 MiB for 2000 tokens of the
tiny model), the sizes where a host that lost half of its rails sets the pace of every rank.
One vLLM with TP=tp (rank r's rails in lab host r) is started per schedule (R2CC_SCHEDULE),
the held faults are put in place once it serves, and the same long prompts are sent one at a
time, `rounds` times. Reported per schedule: the median time to first token (the prefill), the
schedule the planner chose for the prefill's all-reduce size, failovers; and whether every
schedule generated the same tokens (greedy, float32: they must). Deployments run one after the
other, so the load average is printed beside every figure: compare within one run.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

from r2cc_serve.errors import UserError
from r2cc_testbed.faults.model import STEADY_RAIL_FAULTS, labelled, parse_timed
from r2cc_testbed.results import add_out_argument, check_out, write_result
from r2cc_testbed.faults.schedule import HeldFaults
from r2cc_serve.util.rates import check_rate, rate_bits
from r2cc_testbed.serving import evidence
from r2cc_testbed.serving.deploy import single_instance
from r2cc_testbed.lab.session import lab_session
from r2cc_testbed.serving.load import LoadSpec, compare, run_load
from r2cc_testbed.serving.model_dir import temp_model

SCHEDULES = ("auto", "direct", "builtin", "optcc")
SETTLE_S = 3.0  # after the held faults: detection and failover (well under a second) are done


def _say(msg: str) -> None:
    print(f"[serve-prefill] {msg}", file=sys.stderr, flush=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tp", type=int, default=4, choices=[2, 4], help="tensor-parallel ranks, one lab host each")
    p.add_argument("--schedules", default="auto,direct",
                   help=f"comma list of R2CC_SCHEDULE values, one deployment each ({', '.join(SCHEDULES)})")
    p.add_argument("--fault", action="append", default=None, metavar="FAULT",
                   help="a lab fault in place while the prompts run, in the fault notation without @ or + "
                        "(docs/faults.md), e.g. h3:2:degrade:100mbit; repeatable "
                        "(default: h<last>:2:down and h<last>:3:down, half the rails of the last host)")
    # --hold is seconds in every other command: the older form here gets a pointer to the new one.
    p.add_argument("--hold", action="append", default=None, help=argparse.SUPPRESS)
    p.add_argument("--prompt-tokens", type=int, default=1800, help="tokens per prompt (default 1800, max 2000)")
    p.add_argument("--prompts", type=int, default=4, help="distinct prompts (default 4)")
    p.add_argument("--rounds", type=int, default=3, help="times each prompt is sent (default 3)")
    p.add_argument("--max-tokens", type=int, default=8, help="tokens generated per prompt (default 8)")
    p.add_argument("--repeat", type=int, default=2,
                   help="deployments per schedule, interleaved A B A B (default 2)")
    p.add_argument("--rate", default="250mbit", help="rail rate of the lab (default 250mbit: network-bound)")
    p.add_argument("--port", type=int, default=8450, help="vLLM's API port (default 8450)")
    add_out_argument(p, "serve-prefill")


def parse_holds(texts: list[str], hosts: int, rails: int):
    """--fault values: faults that stay in place for the whole run."""
    out = []
    for text in texts:
        label = f"--fault {text.strip()!r}"
        timed = parse_timed(text, STEADY_RAIL_FAULTS, at="none", hold=False, label=label)
        with labelled(label):
            out.append(timed.spec.check_target(hosts, rails))
    return out


def make_prompts(model_dir: str, n: int, tokens: int, seed: int = 0) -> list[str]:
    """n prompts of exactly `tokens` tokens of the model's own tokenizer (corpus words, fixed seed)."""
    from tokenizers import Tokenizer

    from r2cc_testbed.model.corpus import training_text

    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    words = " ".join(training_text()).split()
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        ids: list[int] = []
        while len(ids) < tokens:
            ids += tok.encode(" ".join(rng.choice(words) for _ in range(200))).ids
        prompts.append(tok.decode(ids[:tokens]))
    return prompts


def _planned(status: dict, nbytes: int) -> str:
    """What the ranks' planners chose for an all-reduce of nbytes (from the status files)."""
    for doc in status.values():
        plan = doc.get("plan") or {}
        if plan.get("schedule", "builtin") == "builtin":
            return "builtin"
        fits = [c for c in plan.get("choices", []) if c["size_bucket_bytes"] >= nbytes]
        if not fits:
            continue
        c = min(fits, key=lambda c: c["size_bucket_bytes"])
        modeled = c["schedule"] + (f" K={c['chunks']}" if c["chunks"] > 1 else "")
        trial = [t for t in plan.get("trials", []) if t["size_bucket_bytes"] == c["size_bucket_bytes"] and t["kept"]]
        if trial:  # the ranks measured both and kept one (the latest table's verdict)
            t = trial[-1]
            return (f"{t['kept']} (modeled {modeled}; trial {t['modeled_s'] * 1e3:.0f} ms vs "
                    f"{t['baseline']} {t['baseline_s'] * 1e3:.0f} ms)")
        return modeled
    return "?"


def run(args) -> int:
    schedules = [s.strip() for s in args.schedules.split(",") if s.strip()]
    if not schedules or any(s not in SCHEDULES for s in schedules) or len(set(schedules)) != len(schedules):
        raise UserError(f"--schedules {args.schedules!r}: a comma list of {', '.join(SCHEDULES)}, each once")
    if not 16 <= args.prompt_tokens <= 2000 or args.prompts < 1 or args.rounds < 1 or args.max_tokens < 1 \
            or args.repeat < 1:
        raise UserError("--prompt-tokens 16..2000, --prompts, --rounds, --max-tokens and --repeat >= 1 are needed")
    check_rate(args.rate)
    last = args.tp - 1
    check_out(args.out, "serve-prefill")
    if args.hold:
        raise UserError(f"--hold {args.hold[0]}: serve-prefill now takes its faults as --fault {args.hold[0]} "
                        "(--hold is seconds elsewhere)")
    holds = parse_holds(args.fault if args.fault is not None else [f"h{last}:2:down", f"h{last}:3:down"],
                        args.tp, 4)
    result = {"tp": args.tp, "rate": args.rate, "holds": [h.text for h in holds], "prompt_tokens": args.prompt_tokens,
              "prompts": args.prompts, "rounds": args.rounds, "repeat": args.repeat,
              "schedules": {k: {"ok": 0, "failed": 0, "ttft_s": [], "loadavg": [], "identical": True, "errors": []}
                            for k in schedules}}
    with lab_session(args.tp, 4, args.rate) as lab, temp_model("float32") as model:
        prompts = make_prompts(model, args.prompts, args.prompt_tokens)
        spec = LoadSpec(prompts=prompts * args.rounds, max_tokens=args.max_tokens, concurrency=1,
                        request_timeout_s=300.0, deadline_s=300.0 * len(prompts) * args.rounds)
        reference = None
        for rep in range(args.repeat):  # ABAB...: the box's drift falls on every schedule alike
            for schedule in schedules:
                _say(f"{schedule} ({rep + 1}/{args.repeat}): starting vLLM TP={args.tp} "
                     f"(load average {os.getloadavg()[0]:.1f})")
                res, one = _deployment_round(lab, model, schedule, holds, spec, args)
                e = result["schedules"][schedule]
                for k in ("ok", "failed"):
                    e[k] += one[k]
                e["ttft_s"] += one["ttft_s"]
                e.setdefault("deployment_medians_s", []).append(
                    statistics.median(one["ttft_s"]) if one["ttft_s"] else None)
                e["loadavg"] += one["loadavg"]
                e["errors"] = (e["errors"] + one["errors"])[:3]
                e.update(planned=one["planned"], conns_out=one["conns_out"])
                if reference is None:
                    reference = res
                else:
                    diffs = compare(reference, res)
                    e["identical"] = e["identical"] and not diffs
                    e.setdefault("differences", []).extend(diffs[:3])
                _say(f"{schedule}: prefill median {statistics.median(one['ttft_s']) if one['ttft_s'] else '-'} s, "
                     f"ran {one['planned']}")
    for e in result["schedules"].values():
        e["ttft_median_s"] = statistics.median(e["ttft_s"]) if e["ttft_s"] else None
    print(render(result))
    if args.out:
        _say(f"wrote {write_result(args.out, 'serve-prefill', result)}")
    failed = any(e["failed"] or not e["identical"] for e in result["schedules"].values())
    return 1 if failed else 0


def _deployment_round(lab, model: str, schedule: str, holds, spec: LoadSpec, args):
    """One vLLM with R2CC_SCHEDULE=schedule: faults held, the prompts sent, the faults cleared."""
    with single_instance(lab, model, backend="r2cc", port=args.port, tp=args.tp,
                         extra_env={"R2CC_SCHEDULE": schedule,
                                    # the planner's rail rate: the lab's, as an operator sets the NICs'
                                    "R2CC_RAIL_BPS": str(rate_bits(args.rate) / 8)},
                         extra_args=("--dtype", "float32", "--max-model-len", "2048")) as dep:
        with HeldFaults.on_lab(lab) as faults:
            for h in holds:
                faults.hold(h)
            time.sleep(SETTLE_S)
            held = evidence.read_status(dep.status_dir)
            # connections out of service once the faults are held: proof they bit
            out = sum(r.get("state") != "up" for doc in held.values() for r in doc.get("rails") or [])
            load0 = os.getloadavg()[0]
            res = run_load(dep.url, dep.model, spec)
            status = evidence.read_status_now(dep.status_dir)
    return res, {"ok": len(res.ok), "failed": len(res.failed),
                 "ttft_s": [r.ttft_s for r in res.ok if r.ttft_s is not None],
                 "planned": _planned(status, args.prompt_tokens * 256 * 4), "conns_out": out,
                 "loadavg": [round(load0, 1), round(os.getloadavg()[0], 1)],
                 "errors": [r.error for r in res.failed][:3]}


def render(result: dict) -> str:
    rows = result["schedules"]
    first = next(iter(rows.values()))["ttft_median_s"]
    lines = [f"prefill of {result['prompt_tokens']} tokens, TP={result['tp']}, rails {result['rate']}, "
             f"held: {', '.join(result['holds']) or 'none'}; {result['prompts']} prompts x {result['rounds']} rounds "
             f"x {result.get('repeat', 1)} deployments per schedule, interleaved",
             f"{'schedule':9} {'ok/failed':>9} {'TTFT p50 ms':>11} {'vs first':>8} {'per deployment':>16} "
             f"{'same tokens':>11} {'conns out':>9} {'load':>9}  planned for the prefill size"]
    for name, e in rows.items():
        t = e["ttft_median_s"]
        same = "reference" if name == next(iter(rows)) else ("yes" if e["identical"] else "NO")
        lines.append(f"{name:9} {e['ok']:>4}/{e['failed']:<4} {'-' if t is None else f'{t * 1e3:.0f}':>11} "
                     f"{'-' if not (t and first) else f'{first / t:.2f}x':>8} "
                     f"{'/'.join('-' if x is None else f'{x * 1e3:.0f}' for x in e.get('deployment_medians_s', [])):>16} "
                     f"{same:>11} {e.get('conns_out', '-'):>9} "
                     f"{min(e['loadavg'], default=0):>4}-{max(e['loadavg'], default=0):<4}  {e['planned']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="r2cc serve-prefill", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))
