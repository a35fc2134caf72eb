"""`r2cc bench`: r2cc vs gloo (one rail, a device per rail, MPTCP) vs Open MPI over the same
lab rails, with optional faults.

    r2cc bench --hosts 2 --rails 4 --rate 1gbit --op all_reduce --sizes 4K,1M,64M \\
               --backend r2cc,gloo,gloo-mptcp,mpi --iters 5 --fault h0:1:down@30% --json out.json
    r2cc bench --hosts 4 --rails 4 --rate 250mbit --sizes 64M --backend r2cc \\
               --schedule builtin,direct,optcc,auto --hold-fault h3:2:down --hold-fault h3:3:down
    r2cc bench --hosts 4 --rate 250mbit,500mbit,1gbit,unshaped --sizes 64M --backend r2cc,mpi
    r2cc bench --sizes 4K,1M --backend r2cc,mpi --iters 300 --spin-us 0,100
    r2cc bench --no-lab --rank 0 --world 2 --master 10.0.0.1:29600 --rails eth1,eth2 --sizes 4K,1M,64M
                                                  (each server the same, with its own --rank)
"""

from __future__ import annotations

import signal

from r2cc_testbed.bench import spec
from r2cc_serve.errors import UserError
from r2cc_testbed.results import add_out_argument, check_out, emit
from r2cc_testbed.faults.model import SIZE_FAULTS, labelled
from r2cc_testbed.lab.nft_rules import check_below_mtu


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="benchmark r2cc, gloo and Open MPI collectives on the fault lab",
        description="Brings up the lab, runs one rank per lab host for each backend over the same rail "
                    "interfaces, prints p50, p90, p99, p99.9, max and bus bandwidth per size and writes JSON. Needs root.")
    p.add_argument("--hosts", type=int, default=None, help="lab hosts = ranks (default 2)")
    p.add_argument("--rails", default=None,
                   help="rails per lab host (default 4); with --no-lab the rail interfaces (or IPv4 addresses), "
                        "e.g. eth1,eth2 (default: R2CC_RAILS / R2CC_CONFIG, as the communicator reads them)")
    existing = p.add_argument_group(
        "servers that already exist", "each server runs the same command with its own --rank; no root, no lab, "
        "no faults (docs/performance.md, 'On your own servers')")
    existing.add_argument("--no-lab", action="store_true", help="run one rank here, on this host's own rails")
    existing.add_argument("--rank", type=int, help="this server's rank, 0 .. --world - 1")
    existing.add_argument("--world", type=int, help="how many servers take part")
    existing.add_argument("--master", metavar="ADDR:PORT",
                          help="where rank 0 hosts the store (an address of rank 0 that every server reaches)")
    existing.add_argument("--store-timeout", type=float, default=60.0, metavar="SECONDS",
                          help="how long to wait for every rank to join and to report (default 60)")
    p.add_argument("--rate", help="shape every rail, e.g. 1gbit (default: unshaped); a comma list such as "
                                  "250mbit,1gbit,unshaped runs the whole bench once per rate and ends with "
                                  "bus bandwidth against rate for every backend")
    p.add_argument("--spin-us", metavar="LIST",
                   help="R2CC_SPIN_US for the r2cc ranks; a comma list such as 0,100 runs the whole bench once "
                        "per value and ends with r2cc's latency, CPU and spins against it, the other "
                        "backends' p50 from the same runs beside it (default: the environment's value)")
    p.add_argument("--mtu", type=int, default=None, help="rail MTU (default 1500; 65535 for unshaped bandwidth runs)")
    p.add_argument("--op", default="all_reduce", choices=spec.OPS)
    p.add_argument("--sizes", default="4K,1M,64M", help="message sizes, nccl-tests style (default 4K,1M,64M)")
    p.add_argument("--backend", default="r2cc,gloo,gloo-mptcp,mpi",
                   help=f"comma list of {','.join(spec.BACKENDS)} (default r2cc,gloo,gloo-mptcp,mpi). gloo: torch "
                        "gloo on rail0 alone, as a user configures it; gloo-rails: a gloo device per rail; "
                        "gloo-mptcp: gloo on rail0 under kernel MPTCP with a subflow on every rail (mptcpize); "
                        "mpi: Open MPI's TCP transport striping over every rail; tcp-floor: a plain TCP ring "
                        "all_reduce over the same rails, no failover: what moving and summing the bytes costs "
                        "at all. gloo, gloo-rails and gloo-mptcp are the wirings that serve-bench, demo and the "
                        "load tests call default, default-rails and default-mptcp: vLLM's default backend is gloo")
    p.add_argument("--iters", type=int, default=5, help="timed iterations per size (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations per size (default 2)")
    p.add_argument("--first-calls", type=int, default=0, metavar="N",
                   help="also time the first N calls of each launch's fresh group, before any warm-up, at "
                        "the first size, and print them apart: what a just-started group costs (default 0)")
    p.add_argument("--warmup-s", type=float, default=0.0, metavar="SECONDS",
                   help="repeat the warm-up until this much time has passed (default 0: --warmup calls only). "
                        "Latency studies use 1, so the timed calls see the steady state: r2cc's spin gate "
                        "reads the host's CPU pressure smoothed over about a second")
    p.add_argument("--fault", action="append", default=[], metavar="SPEC",
                   help="h<HOST>:<RAIL>:<KIND>[:ARGS][@PCT%%], KIND down|blackhole|degrade:RATE|lossy:PCT|"
                        "gray[:DIR][:BYTES]|marginal:PCT[:DIR]|flap[:PERIOD_MS:COUNT]; injected PCT (default 30)%% "
                        "into a fault-free op's time")
    p.add_argument("--schedule", metavar="LIST",
                   help="r2cc all_reduce schedules to measure side by side, comma list of "
                        f"{','.join(spec.SCHEDULES)} (builtin: today's C++ path); each row gets T_LB, "
                        "the simulator's prediction and its ratio to builtin/direct")
    p.add_argument("--hold-fault", action="append", default=[], metavar="SPEC",
                   help="r2cc only: a lab fault held for the whole launch (set once the group is up), "
                        "h<HOST>:<RAIL>:down|blackhole|degrade:RATE|lossy:PCT|gray[:DIR][:BYTES]|marginal:PCT[:DIR], "
                        "or drain (that host's rank drains the rail: the same rail out of service, to compare "
                        "with); e.g. two of h3's four rails down make h3 a straggler at beta 0.5")
    p.add_argument("--hold-traffic", type=float, default=0.0, metavar="SECONDS",
                   help="with --hold-fault: run 4 MiB all_reduces for this long once the held faults are in "
                        "place, before any size is measured, so the transport can see and act on a fault "
                        "that only traffic shows (a lossy rail): the rows are then the steady state, and "
                        "the rail states after it are printed (default 0)")
    p.add_argument("--followups", type=int, default=None,
                   help="ops run after the faulted one with the fault still active (default: one per rail)")
    p.add_argument("--fault-reps", type=int, default=1,
                   help="r2cc: faulted ops per fault and size, reported as their median (default 1)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for all iterations of one size")
    p.add_argument("--fault-timeout", type=float, default=20.0,
                   help="seconds one faulted op may take before it counts as not completed (default 20)")
    p.add_argument("--json", metavar="FILE", help="write the report as JSON here ('-' for stdout)")
    add_out_argument(p, "bench", "the report as JSON")
    p.add_argument("--keep-lab", action="store_true", help="leave the lab up afterwards")
    p.set_defaults(func=run)


def parse_rates(text: str | None) -> list[str | None]:
    """--rate as a list of tc rates, None meaning unshaped; UserError on a bad one."""
    from r2cc_serve.util.rates import check_lab_rate

    if not text:
        return [None]
    rates = []
    for item in (x.strip() for x in text.split(",")):
        with labelled("--rate"):
            rates.append(check_lab_rate(item))
    if len(set(rates)) != len(rates):
        raise UserError(f"--rate {text!r} names a rate twice")
    return rates


def parse_spins(text: str | None, backends: list[str]) -> list[int | None]:
    if not text:
        return [None]
    spins = []
    for item in (x.strip() for x in text.split(",")):
        if not item.isdigit():
            raise UserError(f"--spin-us {text!r}: use a comma list of microseconds >= 0, e.g. 0,100")
        spins.append(int(item))
    if len(set(spins)) != len(spins):
        raise UserError(f"--spin-us {text!r} names a value twice")
    if "r2cc" not in backends:
        raise UserError("--spin-us sets how r2cc's ranks wait: it needs backend r2cc")
    return spins


def lab_counts(args) -> None:
    """--hosts, --rails and --mtu as the lab takes them (counts; defaults 2, 4, 1500)."""
    from r2cc_testbed.lab.layout import check_counts

    for flag in ("rank", "world", "master"):
        if getattr(args, flag) is not None:
            raise UserError(f"--{flag} runs the bench on servers that already exist: add --no-lab")
    rails = 4 if args.rails is None else args.rails
    if not str(rails).isdigit():
        raise UserError(f"--rails {rails}: the lab takes a count; interface names go with --no-lab")
    args.hosts, args.rails = args.hosts or 2, int(rails)
    args.mtu = 1500 if args.mtu is None else args.mtu
    check_counts(args.hosts, args.rails, args.mtu)


def options_from_args(args, rate: str | None = None):
    """BenchOptions from the arguments; args.hosts and args.rails are counts by now."""
    from r2cc_testbed.bench.run import BenchOptions

    if args.iters < 1 or args.warmup < 0 or not 0 <= args.warmup_s <= 600:
        raise UserError("--iters must be >= 1, --warmup >= 0 and --warmup-s between 0 and 600 seconds")
    if not 0 <= args.first_calls <= 100000:
        raise UserError(f"--first-calls must be between 0 and 100000, not {args.first_calls}")
    if args.timeout <= 0 or args.fault_timeout <= 0:
        raise UserError("--timeout and --fault-timeout must be positive")
    if args.followups is not None and args.followups < 0:
        raise UserError("--followups must be >= 0")
    if args.fault_reps < 1:
        raise UserError("--fault-reps must be >= 1")
    sizes = spec.parse_sizes(args.sizes)
    backends = spec.parse_backends(args.backend)
    holds = [spec.parse_hold(h, args.hosts, args.rails) for h in args.hold_fault]
    if args.hold_traffic < 0 or (args.hold_traffic and not holds):
        raise UserError("--hold-traffic takes seconds >= 0 and needs --hold-fault")
    if holds and backends != ["r2cc"]:
        raise UserError("--hold-fault keeps rails broken for a whole launch: only r2cc survives that "
                        "(use --backend r2cc)")
    for s in sizes:
        spec.check_op_size(args.op, s, args.hosts)
    spec.check_floor(backends, args.op, args.fault)
    faults = [spec.parse_fault(f, args.hosts, args.rails) for f in args.fault]
    for option, given in (("--fault", faults), ("--hold-fault", holds)):
        for f in (f for f in given if f.fault.kind in SIZE_FAULTS):  # packets the MTU lets be longer
            with labelled(f"{option} {f.text!r}"):
                check_below_mtu(f.fault.kind, f.fault.max_bytes, args.mtu)
    return BenchOptions(
        hosts=args.hosts, rails=args.rails, rate=rate, mtu=args.mtu,
        op=args.op, sizes=sizes, backends=backends, iters=args.iters,
        schedules=spec.parse_schedules(args.schedule, args.op, backends), holds=holds,
        warmup=args.warmup, warmup_s=args.warmup_s, first_calls=args.first_calls, faults=faults,
        timeout_s=args.timeout, fault_timeout_s=args.fault_timeout, followups=args.followups,
        fault_reps=args.fault_reps, hold_traffic_s=args.hold_traffic,
        keep_lab=args.keep_lab)


def _check_backends(backends: list[str]) -> None:
    if "mpi" in backends:
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            raise UserError("backend mpi needs mpi4py: pip install mpi4py "
                            "(and apt-get install -y openmpi-bin libopenmpi-dev)") from None
    if "gloo-mptcp" in backends:
        from r2cc_testbed.lab import mptcp

        if not mptcp.supported():
            raise UserError("backend gloo-mptcp needs a kernel with MPTCP (sysctl net.mptcp.enabled=1) and an "
                            "iproute2 that knows `ip mptcp`")
        mptcp.preload_env()  # mptcpize present, the gloo fix built: fail here, not in a rank
    if "r2cc" in backends:
        try:
            from r2cc_serve import _C  # noqa: F401
        except ImportError:
            raise UserError("backend r2cc needs the C++ core: python setup.py build_ext --inplace") from None


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def run(args) -> int:
    import dataclasses
    import os

    from r2cc_testbed.bench.results import rate_table, spin_table, table
    from r2cc_testbed.bench.hosts import LabHosts
    from r2cc_testbed.bench.run import Bench, say

    check_out(args.out, "bench")
    if args.no_lab:
        from r2cc_testbed.bench import existing_cli
        rails, master = existing_cli.check_args(args)
        opts = options_from_args(args)
        opts = dataclasses.replace(opts, spin_us=parse_spins(args.spin_us, opts.backends)[0])
        signal.signal(signal.SIGTERM, _interrupt)  # children killed on the way out, as on the lab
        return existing_cli.run(args, opts, rails, master)
    lab_counts(args)
    rates = parse_rates(args.rate)
    opts = options_from_args(args)  # bad input fails before anything is built
    spins = parse_spins(args.spin_us, opts.backends)
    if os.geteuid() != 0:
        raise UserError("r2cc bench builds the network lab and needs root; run it with sudo or as root")
    _check_backends(opts.backends)
    # SIGTERM takes the same clean-up path as Ctrl-C (children killed, lab down).
    signal.signal(signal.SIGTERM, _interrupt)
    runs = [(rate, spin) for rate in rates for spin in spins]
    reports = []
    for i, (rate, spin) in enumerate(runs):
        if len(runs) > 1:
            say(f"run {i + 1} of {len(runs)}: rate {rate or 'unshaped'}" + ("" if spin is None else f", r2cc spin_us {spin}"))
        last = i == len(runs) - 1
        run_opts = dataclasses.replace(opts, rate=rate, spin_us=spin, keep_lab=opts.keep_lab and last)
        report = Bench(run_opts, LabHosts(run_opts)).run()
        print(table(report) + ("\n" if not last else ""), flush=True)
        reports.append(report)
    if len(rates) > 1:
        for k in range(len(spins)):
            print("\n" + rate_table(reports[k::len(spins)]))
    if len(spins) > 1:
        for k in range(len(rates)):
            print("\n" + spin_table(reports[k * len(spins):(k + 1) * len(spins)]))
    emit(args, "bench", reports[0] if len(reports) == 1 else {"sweep": reports})
    # Failure: a wrong fault-free result, or r2cc not surviving a fault bit-exactly (its promise).
    # gloo/MPI failing under a fault is the expected, reported outcome.
    ok = all(all(r["correct"] for r in report["results"]) and all(
        f["completed"] and f["bit_exact"] for f in report["faults"] if f["backend"] == "r2cc")
        for report in reports)
    return 0 if ok else 1
