"""`r2cc sim`: simulate all-reduce schedules under degraded ranks, against the lower bound.

    r2cc sim --p 4,16,64,256,1024 --beta 0.25,0.5,0.75,0.875 --degraded 1,2,8 \\
             --sizes 1M,64M --schedules direct,ring,r2ccl,optcc --json out.json --plot out.png

The last ``d`` ranks keep ``beta`` of the bandwidth B. Each schedule's time is printed as a
multiple of the lower bound T_LB; T_LB itself and the fault-free optimum are in milliseconds.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sys
import time

from r2cc_serve.errors import UserError
from r2cc_serve.sched import builders, cost
from r2cc_serve.sched.bandwidth import Bandwidth
from r2cc_serve.sched.ir import PlanError
from r2cc_serve.sched.sim import simulate

MAX_P = 1024  # a ring at 1024 ranks is 5M steps; beyond that memory, not time, runs out
MAX_P_FLAT = 256  # --no-symmetry builds every rank's program


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "sim", help="simulate all-reduce schedules with degraded ranks (flow-level, to 1024 ranks)",
        description="Flow-level simulation (max-min sharing of each rank's in/out capacity, FIFO per "
                    "connection, the plan's dependencies) of each schedule, printed against the lower "
                    "bound T_LB and the fault-free optimum.")
    p.add_argument("--p", default="4,16,64", help="group sizes (default 4,16,64)")
    p.add_argument("--beta", default="0.5,0.75", help="bandwidth fraction each degraded rank keeps (default 0.5,0.75)")
    p.add_argument("--degraded", default="1", help="how many ranks are degraded (default 1)")
    p.add_argument("--sizes", default="64M", help="bytes per rank, K/M/G = KiB/MiB/GiB (default 64M)")
    p.add_argument("--schedules", default="direct,ring,r2ccl,optcc",
                   help=f"comma list of {','.join(builders.SCHEDULES)} (default direct,ring,r2ccl,optcc)")
    p.add_argument("--bandwidth", default="12.5G", help="B, bytes/s per rank and direction (default 12.5G = 100 Gbit/s)")
    p.add_argument("--alpha-us", type=float, default=0.0, help="latency per message, microseconds (default 0)")
    p.add_argument("--reduce-gbps", type=float, default=0.0, help="reduction speed, GB/s of inputs read (default 0: free)")
    p.add_argument("--chunks", default="auto",
                   help="micro-chunks for optcc and r2ccl: a number or auto (the cost model's choice)")
    p.add_argument("--min-piece", default="1K", help="auto chunks keep pieces at least this big (default 1K)")
    p.add_argument("--max-chunks", type=int, default=64, help="auto chunks at most this many (default 64)")
    p.add_argument("--elem-bytes", type=int, default=4, help="element size (default 4: fp32)")
    p.add_argument("--no-symmetry", action="store_true", help="simulate every rank (slow; for checking)")
    p.add_argument("--json", metavar="FILE", help="write every result as JSON here ('-' for stdout)")
    p.add_argument("--plot", metavar="PNG", help="plot time / T_LB against p (needs matplotlib)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)(?:i?B)?\s*", text)
    if not m:
        raise UserError(f"size {text!r}: use a number with an optional K, M or G suffix, e.g. 64M")
    value = float(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]
    if value < 1:
        raise UserError(f"size {text!r} must be at least one byte")
    return int(value)


def _parse_list(text: str, kind, what: str, check, rule: str) -> list:
    out = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        try:
            value = kind(item)
        except (ValueError, UserError) as exc:
            raise UserError(f"--{what} {text!r}: {item!r} is not valid ({exc})") from None
        if not check(value):
            raise UserError(f"--{what} {text!r}: {item!r} {rule}")
        out.append(value)
    if not out:
        raise UserError(f"--{what} needs at least one value")
    return list(dict.fromkeys(out))


def _options(args) -> dict:
    o = {
        "ps": _parse_list(args.p, int, "p", lambda v: 2 <= v <= MAX_P, f"must be 2..{MAX_P}"),
        "betas": _parse_list(args.beta, float, "beta", lambda v: 0 < v <= 1, "must be in (0, 1]"),
        "degraded": _parse_list(args.degraded, int, "degraded", lambda v: v >= 1, "must be >= 1"),
        "sizes": _parse_list(args.sizes, parse_size, "sizes", lambda v: v > 0, "must be > 0"),
        "schedules": _parse_list(args.schedules, str.strip, "schedules", lambda v: v in builders.SCHEDULES,
                                 f"is not one of {', '.join(builders.SCHEDULES)}"),
        "B": parse_size(args.bandwidth),
    }
    if args.alpha_us < 0 or args.reduce_gbps < 0 or args.elem_bytes < 1 or args.max_chunks < 1:
        raise UserError("--alpha-us and --reduce-gbps must be >= 0, --elem-bytes and --max-chunks >= 1")
    if args.chunks != "auto":
        o["chunks"] = _parse_list(args.chunks, int, "chunks", lambda v: 1 <= v <= 4096, "must be 1..4096 or auto")[0]
    o["model"] = cost.CostModel(alpha_s=args.alpha_us * 1e-6, overhead_s=0.0, reduce_Bps=args.reduce_gbps * 1e9,
                                min_piece_bytes=parse_size(args.min_piece), max_chunks=args.max_chunks)
    return o


def run(args) -> int:
    o = _options(args)
    if args.no_symmetry and max(o["ps"]) > MAX_P_FLAT:
        raise UserError(f"--no-symmetry simulates every rank: use it with --p up to {MAX_P_FLAT}")
    for path in (args.json, args.plot):
        _check_writable(path)
    if args.plot:
        _require_matplotlib()
    configs = [c for c in itertools.product(o["ps"], o["betas"], o["degraded"], o["sizes"]) if c[2] < c[0]]
    skipped = len(o["ps"]) * len(o["betas"]) * len(o["degraded"]) * len(o["sizes"]) - len(configs)
    if not configs:
        raise UserError("every --degraded value is >= every --p: at least one rank must stay healthy")
    progress = _Progress(len(configs), quiet=args.quiet)
    rows = []
    print(_header(o["schedules"]))
    for i, (p, beta, d, size) in enumerate(configs):
        progress.show(i, f"p={p} beta={beta} degraded={d} size={size}")
        row = _simulate_config(p, beta, d, size, o, args)
        rows.append(row)
        progress.clear()
        print(_format_row(row, o["schedules"]), flush=True)
    progress.done()
    sys.stdout.flush()
    if skipped:
        print(f"({skipped} combinations skipped: degraded >= p)")
    print("times are multiples of T_LB; T_LB and fault-free (ff) in ms; [K] = micro-chunks used")
    if args.json:
        _write_json(args.json, {"bandwidth_Bps": o["B"], "alpha_s": o["model"].alpha_s, "results": rows})
    if args.plot:
        _plot(rows, o["schedules"], args.plot)
        print(f"plot written to {args.plot}")
    return 0


def _simulate_config(p: int, beta: float, d: int, size: int, o: dict, args) -> dict:
    B = float(o["B"])
    bw = Bandwidth.degraded(p, B, {r: beta for r in range(p - d, p)})
    count = max(1, size // args.elem_bytes)
    M = count * args.elem_bytes
    lb = cost.lower_bound(p, [beta] * d, M, B)
    row = {"p": p, "beta": beta, "degraded": d, "bytes": M, "lower_bound_s": lb,
           "fault_free_s": cost.fault_free_time(p, M, B), "ring_closed_form_s": cost.equal_share_time(p, [beta] * d, M, B),
           "schedules": {}}
    for name in o["schedules"]:
        chunks = o.get("chunks") or cost.estimate(name, bw, M, o["model"], args.elem_bytes).chunks
        t0 = time.perf_counter()
        try:
            plan = builders.build(name, p, count, bw=bw, elem_bytes=args.elem_bytes, chunks=chunks)
            res = simulate(plan, bw, alpha_s=o["model"].alpha_s, reduce_Bps=o["model"].reduce_Bps,
                           use_symmetry=not args.no_symmetry)
        except (PlanError, MemoryError) as exc:
            raise UserError(f"{name} at p={p}: {exc}") from None
        row["schedules"][name] = {"seconds": res.seconds, "vs_lower_bound": res.seconds / lb,
                                  "vs_fault_free": res.seconds / row["fault_free_s"], "chunks": chunks,
                                  "engine": res.engine, "simulated_ranks": res.representatives,
                                  "steps": res.steps, "events": res.events,
                                  "wall_s": round(time.perf_counter() - t0, 3)}
    return row


def _header(schedules: list[str]) -> str:
    cols = "".join(f"{s:>14}" for s in schedules)
    return f"{'p':>5} {'beta':>6} {'deg':>4} {'size':>6} {'T_LB ms':>9} {'ff ms':>8}{cols}"


def _format_row(row: dict, schedules: list[str]) -> str:
    cells = []
    for s in schedules:
        r = row["schedules"][s]
        k = f"[{r['chunks']}]" if s in ("optcc", "r2ccl") else ""
        cells.append(f"{r['vs_lower_bound']:>9.3f}{k:>5}")
    return (f"{row['p']:>5} {row['beta']:>6g} {row['degraded']:>4} {_size(row['bytes']):>6} "
            f"{row['lower_bound_s'] * 1e3:>9.3f} {row['fault_free_s'] * 1e3:>8.3f}" + "".join(cells))


def _size(n: int) -> str:
    for unit, f in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f}{unit}"
    return str(n)


class _Progress:
    """One updating line on a terminal; on a pipe, a line when a run has taken a while."""

    def __init__(self, total: int, quiet: bool) -> None:
        self.total, self.quiet = total, quiet
        self.tty = sys.stderr.isatty()
        self.start = self.last = time.monotonic()

    def show(self, i: int, what: str) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        msg = f"sim {i + 1}/{self.total} {what} ({now - self.start:.0f}s)"
        if self.tty:
            print(f"\r{msg:<78}", end="", file=sys.stderr, flush=True)
        elif now - self.last > 10:
            print(msg, file=sys.stderr, flush=True)
            self.last = now

    def clear(self) -> None:
        if self.tty and not self.quiet:
            print("\r" + " " * 78 + "\r", end="", file=sys.stderr, flush=True)

    def done(self) -> None:
        if not self.quiet:
            print(f"sim: {self.total} configurations in {time.monotonic() - self.start:.1f}s", file=sys.stderr)


def _check_writable(path: str | None) -> None:
    """Fail before a long run, not after it."""
    if not path or path == "-":
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise UserError(f"cannot write {path}: {folder} is not a writable folder")


def _write_json(path: str, data: dict) -> None:
    text = json.dumps(data, indent=1)
    if path == "-":
        print(text)
        return
    try:
        with open(path, "w") as f:
            f.write(text + "\n")
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}") from None


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError("--plot needs matplotlib: pip install matplotlib (or the project's [bench] extra)") from None


def _plot(rows: list[dict], schedules: list[str], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    betas = sorted({r["beta"] for r in rows})
    d0 = min(r["degraded"] for r in rows)
    size = max(r["bytes"] for r in rows)
    fig, axes = plt.subplots(1, len(betas), figsize=(4 * len(betas), 3.6), squeeze=False, sharey=True)
    for ax, beta in zip(axes[0], betas):
        sel = sorted((r for r in rows if r["beta"] == beta and r["degraded"] == d0 and r["bytes"] == size),
                     key=lambda r: r["p"])
        ps = [r["p"] for r in sel]
        for s, style in zip(schedules, itertools.cycle(["-", "--", "-.", ":"])):  # equal curves stay visible
            ax.plot(ps, [r["schedules"][s]["vs_lower_bound"] for r in sel], style, marker="o", label=s)
        ax.plot(ps, [r["fault_free_s"] / r["lower_bound_s"] for r in sel], "k", lw=0.8, label="fault-free")
        ax.set_xscale("log", base=2)
        ax.set_title(f"beta={beta:g}, {d0} degraded, {_size(size)}")
        ax.set_xlabel("ranks p")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("time / lower bound")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}") from None
    finally:
        plt.close(fig)
