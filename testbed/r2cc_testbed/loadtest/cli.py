"""`r2cc loadtest list | run SCENARIO... [--quick] [--out DIR] | report DIR`."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time

from r2cc_serve.errors import UserError

DEFAULT_PORT = 8470
DEFAULT_LAB_PREFIX = "r2ccl"  # subnets 10.246/10.247: beside the tests' and the demo's labs


def register(sub) -> None:
    p = sub.add_parser("loadtest", help="load tests: tail latency under scheduled faults (vllm bench serve)",
                       description="Scenarios in loadtests/scenarios: fault-free and faulted rounds interleaved, "
                                   "overheads with 95% intervals, report.md with figures.")
    lsub = p.add_subparsers(dest="loadtest_command", metavar="ACTION", required=True)
    ls = lsub.add_parser("list", help="the shipped scenarios")
    ls.set_defaults(func=_list)
    run = lsub.add_parser("run", help="run scenarios and write the report (needs root and vLLM)")
    run.add_argument("scenarios", nargs="+", metavar="SCENARIO",
                     help="YAML file(s), scenario name(s) from `r2cc loadtest list`, or `all`")
    run.add_argument("--quick", action="store_true", help="each scenario's small `quick:` variant (minutes)")
    run.add_argument("--out", help="results folder (default ./loadtest-results/<date-time>)")
    run.add_argument("--backends", help="backends to run instead of the scenario's, comma-separated: r2cc, and vLLM's "
                                        "default backend with gloo on rail0 (default), a device per rail "
                                        "(default-rails) or under MPTCP with a subflow per rail (default-mptcp)")
    run.add_argument("--pairs", type=int, help="fault-free/faulted pairs of rounds (overrides the scenario's)")
    run.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"vLLM's port (default {DEFAULT_PORT})")
    run.add_argument("--lab-prefix", default=DEFAULT_LAB_PREFIX,
                     help=f"lab prefix (default {DEFAULT_LAB_PREFIX}); the lab is built and removed by the run")
    run.set_defaults(func=_run)
    rep = lsub.add_parser("report", help="re-render report.md, report.json and figures from saved results")
    rep.add_argument("dir", metavar="DIR", help="the --out folder of a run (or one scenario folder in it)")
    rep.set_defaults(func=_report)


def _say(msg: str) -> None:
    print(f"[loadtest {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _list(args) -> int:
    from r2cc_testbed.loadtest.scenario import list_scenarios, scenario_dir

    for sc in list_scenarios():
        faults = "; ".join(f"{s.after_s:g}s {s.notation}" for s in sc.schedule.entries)
        if sc.reference.entries:
            faults += " (against: " + "; ".join(f"{s.after_s:g}s {s.notation}" for s in sc.reference.entries) + ")"
        print(f"{sc.name:24} {','.join(sc.backends):26} {sc.shape:9} {faults}")
        if sc.description:
            print(f"{'':24} {sc.description.splitlines()[0]}")
    print(f"\n(files in {scenario_dir()}; run one with `r2cc loadtest run NAME [--quick]`)")
    return 0


def resolve(names: list[str]) -> list[str]:
    """Scenario arguments to file paths: a path, a name in loadtests/scenarios, or `all`."""
    from r2cc_testbed.loadtest.scenario import scenario_dir

    folder = scenario_dir()
    paths = []
    for name in names:
        if name == "all":
            paths += sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith((".yaml", ".yml")))
        elif os.path.isfile(name):
            paths.append(name)
        elif os.path.isfile(os.path.join(folder, f"{name}.yaml")):
            paths.append(os.path.join(folder, f"{name}.yaml"))
        else:
            raise UserError(f"no scenario {name!r}: give a YAML file or one of the names `r2cc loadtest list` shows")
    return paths


def command_line_overrides(args) -> dict:
    """--backends and --pairs as scenario overrides (checked by the scenario parser like the file)."""
    out: dict = {}
    if args.backends is not None:
        out["deployment"] = {"backends": [b.strip() for b in args.backends.split(",") if b.strip()]}
    if args.pairs is not None:
        if args.pairs < 1:
            raise UserError(f"--pairs {args.pairs}: give at least 1")
        out["method"] = {"pairs": args.pairs}
    return out


def _preflight() -> None:
    if os.geteuid() != 0:
        raise UserError("load tests need root (the fault lab's namespaces, the fault daemon's priority)")
    if shutil.which("vllm") is None:
        raise UserError("the `vllm` command is not on PATH; run scripts/install_vllm.sh")
    try:
        import matplotlib  # noqa: F401  (fail now, not after an hour of rounds)
    except ImportError:
        raise UserError("the report's figures need matplotlib: pip install matplotlib") from None


def _run(args) -> int:
    from r2cc_testbed.loadtest.report import write_report
    from r2cc_testbed.loadtest.runner import run_scenario
    from r2cc_testbed.loadtest.scenario import load_scenario

    overrides = command_line_overrides(args)
    scenarios = [load_scenario(p, quick=args.quick, overrides=overrides) for p in resolve(args.scenarios)]  # checked up front
    _preflight()
    out = os.path.abspath(args.out or os.path.join("loadtest-results", time.strftime("%Y%m%d-%H%M%S")))
    os.makedirs(out, exist_ok=True)
    _say(f"{len(scenarios)} scenario(s) -> {out}")
    old = signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill` cleans up like Ctrl-C
    try:
        for sc in scenarios:
            run_scenario(sc, out, port=args.port, lab_prefix=args.lab_prefix, say=_say)
            write_report(out)  # after each scenario: a long run has a report even if stopped later
    finally:
        signal.signal(signal.SIGTERM, old)
    md = write_report(out)
    return _print_summary(out, md)


def _report(args) -> int:
    from r2cc_testbed.loadtest.report import write_report

    if not os.path.isdir(args.dir):
        raise UserError(f"{args.dir} is not a folder")
    md = write_report(args.dir)
    return _print_summary(args.dir, md)


def _print_summary(out: str, md: str) -> int:
    import json

    with open(os.path.join(out, "report.json")) as f:
        rows = json.load(f)["summary"]
    bad = False
    for r in rows:
        o = r["tpot_p99"]
        tpot = "-" if o.get("overhead") is None else f"{o['overhead']:+.1%}"
        print(f"{r['scenario']:24} {r['backend']:8} ok {r['ok']:4} failed {r['failed']:3}  outputs {r['outputs']:18} "
              f"p99 TPOT {tpot}")
        bad |= r["backend"] == "r2cc" and (r["failed"] > 0 or r["outputs"] != "identical")
    print(f"report: {md}")
    return 1 if bad else 0
