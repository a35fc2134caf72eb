"""`r2cc bench --no-lab`: the arguments of the bench on servers that already exist, checked
before anything starts (a one-line error, exit 2), then one run (bench/existing.py); cli.py
calls both."""

from __future__ import annotations

from r2cc_serve.errors import UserError
from r2cc_testbed.results import emit

LAB_ONLY = (("hosts", "--hosts (use --world)"), ("rate", "--rate"), ("mtu", "--mtu"), ("fault", "--fault"),
            ("hold_fault", "--hold-fault"), ("hold_traffic", "--hold-traffic"), ("keep_lab", "--keep-lab"))


def parse_master(text: str | None) -> tuple[str, int]:
    host, _, port = (text or "").rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UserError(f"--master {text!r}: give ADDR:PORT, e.g. 10.0.0.1:29600 (an address of rank 0)")
    return host.strip("[]"), int(port)


def rail_names(text: str | None, rank: int) -> list[str]:
    """--rails as names, else the communicator's own rail map (R2CC_RAILS / R2CC_CONFIG)."""
    from r2cc_serve.comm.rail_config import load_rail_config

    if text is None:
        cfg = load_rail_config(rank)
        if cfg.netns:
            raise UserError(f"the rail map puts the rails in namespace {cfg.netns}: --no-lab runs on this host's "
                            "own interfaces (unset R2CC_NETNS, or give --rails)")
        rails = cfg.rails
    else:
        rails = [x.strip() for x in text.split(",") if x.strip()]
    if not rails or all(r.isdigit() for r in rails):
        raise UserError(f"--rails {text!r}: with --no-lab name the rail interfaces (eth1,eth2) or their addresses")
    return rails


def check_args(args) -> tuple[list[str], tuple[str, int]]:
    """Bad input as a UserError; the rails and the store's address when all is well."""
    for attr, flag in LAB_ONLY:
        if getattr(args, attr) not in (None, False, [], 0.0):
            raise UserError(f"{flag} needs the lab; --no-lab measures the hosts as they are")
    if args.world is None or args.rank is None or args.master is None:
        raise UserError("--no-lab needs --rank, --world and --master (every server the same but for --rank)")
    if args.world < 2 or not 0 <= args.rank < args.world:
        raise UserError(f"--rank {args.rank} --world {args.world}: the world is 2 or more, the rank 0 .. world-1")
    if not 1 <= args.store_timeout <= 3600:
        raise UserError("--store-timeout takes seconds between 1 and 3600")
    if args.spin_us and "," in args.spin_us:
        raise UserError("--spin-us takes one value with --no-lab (a sweep would reuse the store's keys)")
    master = parse_master(args.master)
    rails = rail_names(args.rails, args.rank)
    args.hosts, args.rails, args.mtu = args.world, len(rails), 1500
    return rails, master


def run(args, opts, rails: list[str], master: tuple[str, int]) -> int:
    """One run on this server; opts: BenchOptions from the checked arguments (cli.py)."""
    from r2cc_testbed.bench.existing import ExistingHosts
    from r2cc_testbed.bench.results import table
    from r2cc_testbed.bench.run import Bench

    if "r2cc" in opts.backends:
        try:
            from r2cc_serve import _C  # noqa: F401
        except ImportError:
            raise UserError("backend r2cc needs the C++ core: python setup.py build_ext --inplace") from None
    fingerprint = {k: getattr(opts, k) for k in ("op", "sizes", "backends", "iters", "warmup", "warmup_s",
                                                  "schedules", "timeout_s", "spin_us")}
    fingerprint.update(world=args.world, rails=len(rails))
    hosts = ExistingHosts(args.rank, args.world, master, rails, opts.backends, fingerprint, args.store_timeout)
    report = Bench(opts, hosts).run()
    report["rail_names"] = rails
    ok = all(r["correct"] for r in report["results"])
    if args.rank == 0:
        print(table(report), flush=True)
    else:
        ran = [b for b in opts.backends if b not in {x["backend"] for x in report["skipped"]}]
        print(f"rank {args.rank} of {args.world}: took part in {', '.join(ran) or 'nothing'} on "
              f"{','.join(rails)}; rank 0 prints the table", flush=True)
    emit(args, "bench", report)
    return 0 if ok else 1
