"""What the lab allows, beside each measured r2cc schedule: T_LB and the simulator's prediction.

Each host's capacity (each direction) is the sum of its rails' tbf rates, with held faults
applied: a rail down or blackholed counts 0, a degraded one its new rate. T_LB
(``cost.lower_bound_of``) uses those line rates, as the formula does. The simulator
(``sched.sim``) runs the very plan the ranks ran (``sched.group.plan_of`` rebuilds it from
sched/'s report, ``Communicator.plan_ran``) at the payload rate TCP gets from a line rate at this MTU,
MSS/frame = (mtu - 52)/(mtu + 14) (95.7% at 1500, as measured: docs/design.md): the lab's rates,
nothing fitted to the run. Unshaped labs have no rate: no expectations then.
"""

from __future__ import annotations

import functools

from r2cc_testbed.bench.spec import format_size, parse_hold
from r2cc_serve.util.rates import rate_bits
from r2cc_serve.sched import cost
from r2cc_serve.sched.bandwidth import Bandwidth
from r2cc_serve.sched.group import plan_of
from r2cc_serve.sched.sim import simulate
from r2cc_serve.util.durations import millis

_ms = functools.partial(millis, digits=1, unit=False)  # table cells: the header says ms


def host_line_Bps(hosts: int, rails: int, rate: str, held: list[str]) -> list[float]:
    """Bytes/s each host can send (and receive) over its rails, held faults applied."""
    per_rail = [[rate_bits(rate) / 8] * rails for _ in range(hosts)]
    for text in held:
        f = parse_hold(text, hosts, rails).fault
        per_rail[f.host][f.rail] = rate_bits(f.rate) / 8 if f.kind == "degrade" else 0.0
    return [sum(r) for r in per_rail]


def payload_share(mtu: int) -> float:
    return (mtu - 52) / (mtu + 14)


def add_expectations(report: dict) -> None:
    """Adds t_lb_s, sim_s, fault_free_s and speed-ups over builtin/direct to r2cc schedule rows."""
    if not report.get("rate"):
        return
    p, rows = report["hosts"], [r for r in report["results"] if r.get("schedule")]
    per_host = host_line_Bps(p, report["rails"], report["rate"], report.get("held_faults", []))
    line = Bandwidth(per_host, per_host)
    payload = Bandwidth(line.out_Bps * payload_share(report["mtu"]), line.in_Bps * payload_share(report["mtu"]))
    full = rate_bits(report["rate"]) / 8 * report["rails"]
    for r in rows:
        M = r["bytes"]
        r["t_lb_s"] = cost.lower_bound_of(line, M)
        r["fault_free_s"] = cost.fault_free_time(p, M, full)
        if r.get("plan_ran"):  # None: no call of that shape ran on the current table
            plan = plan_of(r["plan_ran"], p)
            r["sim_s"] = simulate(plan, payload).seconds
            r["sim_plan"] = plan.summary()
        for other in ("builtin", "direct"):
            ref = next((x["p50_s"] for x in rows if x["schedule"] == other and x["bytes"] == M), None)
            if ref and r["p50_s"]:
                r[f"speedup_vs_{other}"] = ref / r["p50_s"]


def _x(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def schedule_table(report: dict) -> str:
    """The schedule rows against the bound, the simulator and the other schedules."""
    held = ", ".join(report.get("held_faults") or []) or "none"
    lines = [f"schedules (r2cc all_reduce), held faults: {held}; T_LB at line rate, sim at TCP payload rate",
             f"{'schedule':9} {'bytes':>6} {'p50 ms':>9} {'T_LB ms':>9} {'p50/T_LB':>8} {'sim ms':>9} "
             f"{'p50/sim':>7} {'x builtin':>9} {'x direct':>8}  plan"]
    for r in report["results"]:
        if not r.get("schedule"):
            continue
        p50, lb, sim = r.get("p50_s"), r.get("t_lb_s"), r.get("sim_s")
        plan = r.get("sim_plan") or {}
        desc = plan.get("schedule", "?") + (f" K={plan['chunks']}" if plan.get("chunks", 1) > 1 else "")
        if plan.get("shares"):
            desc += " shares " + "/".join(f"{x:.3f}" for x in plan["shares"])
        lines.append(f"{r['schedule']:9} {format_size(r['bytes']):>6} {_ms(p50):>9} {_ms(lb):>9} "
                     f"{_x(p50 / lb if p50 and lb else None):>8} {_ms(sim):>9} "
                     f"{_x(p50 / sim if p50 and sim else None):>7} {_x(r.get('speedup_vs_builtin')):>9} "
                     f"{_x(r.get('speedup_vs_direct')):>8}  {desc}")
    return "\n".join(lines)

