"""Turning per-rank worker results into the bench report: medians, busbw, ratios, the table.

One iteration's time is the slowest rank's (every iteration starts after a barrier), as a
collective is only done when its last rank is. Quote p50 and ratios: the box is noisy.
"""

from __future__ import annotations

import functools

import numpy as np

from r2cc_testbed.bench.spec import WAIT_COUNTS, format_size
from r2cc_serve.sched.planner import PARTIAL_SUM_SCHEDULES  # not the canonical sum: checked with a tolerance
from r2cc_serve.util.durations import millis

_ms = functools.partial(millis, digits=3, unit=False)  # table cells: the header says ms


def busbw_factor(op: str, world: int) -> float:
    """nccl-tests bus bandwidth factor: algbw * factor is comparable across world sizes."""
    if op == "all_reduce":
        return 2 * (world - 1) / world
    if op in ("all_gather", "reduce_scatter"):
        return (world - 1) / world
    return 1.0


def _first_error(entries: list[dict | None]) -> str | None:
    for e in entries:
        if e is None:
            return "rank produced no result (killed or crashed)"
        if e.get("error"):
            return e["error"]
    return None


def summarize_measure(backend: str, op: str, world: int, size: int, entries: list[dict | None],
                      schedule: str | None = None) -> dict:
    """One results row from every rank's entry for one (size, group, r2cc schedule)."""
    row = {"backend": backend, "bytes": size, "p50_s": None, "p90_s": None, "p99_s": None, "p999_s": None,
           "max_s": None, "iters": None, "busbw_GBps": None,
           "cpu_s_per_GB": None, "correct": False, "bit_exact": False, "error": _first_error(entries)}
    if schedule:
        row["schedule"] = schedule
    if row["error"] is not None:
        row["errors_by_rank"] = [None if e is None else e.get("error") for e in entries]
        return row
    per_iter = np.max(np.array([e["times"] for e in entries]), axis=0)
    p50, p90 = float(np.percentile(per_iter, 50)), float(np.percentile(per_iter, 90))
    exact = all(e["bit_exact"] for e in entries)
    # r2cc promises the canonical rank-order sum bit for bit (a forced partial-sum schedule and
    # the other libraries get a float tolerance).
    canonical = backend == "r2cc" and schedule not in PARTIAL_SUM_SCHEDULES
    correct = exact if canonical else all(e["close"] for e in entries)
    tx = np.sum(np.array([e["rail_tx_bytes"] for e in entries]), axis=0)
    p99 = tail(per_iter, 99)
    row.update(p50_s=p50, p90_s=p90, p99_s=p99, p999_s=tail(per_iter, 99.9),
               max_s=float(per_iter.max()), iters=len(per_iter), hist=histogram(per_iter), busbw_GBps=size / p50 / 1e9 * busbw_factor(op, world),
               cpu_s_per_GB=cpu_seconds_per_GB(entries, size),
               correct=bool(correct), bit_exact=bool(exact), max_err=max(e["max_err"] for e in entries),
               rail_tx_share=[round(float(x) / max(1.0, float(tx.sum())), 3) for x in tx],
               resent_bytes=int(sum(e.get("resent_bytes", 0) for e in entries)),
               failovers=int(sum(e.get("failovers", 0) for e in entries)),
               **{k: int(sum(e.get(k, 0) for e in entries)) for k in WAIT_COUNTS},
               mean_chunk_bytes=mean_chunk_bytes(entries),
               rail_errors=sorted({x for e in entries for x in e.get("rail_errors", [])})[:8])
    row.update(switch_counts(per_iter, p99, entries))
    if all(e.get("first_times") for e in entries):
        first = np.max(np.array([e["first_times"] for e in entries]), axis=0)
        row["first_calls"] = {"n": len(first), "p50_s": float(np.percentile(first, 50)), "p99_s": tail(first, 99),
                              "max_s": float(first.max()), "first_s": float(first[0])}
    if schedule and entries[0].get("plan"):
        row["plan"] = entries[0]["plan"]
    if schedule and entries[0].get("plan_ran"):  # every rank ran the same plan
        row["plan_ran"] = entries[0]["plan_ran"]
    return row


def switch_counts(per_iter: np.ndarray, p99: float | None, entries: list[dict]) -> dict:
    """How many calls had a calling thread (on any rank) that slept or was preempted
    (worker.call_switches), over all timed calls and over the slowest 1% (at or above p99, None
    with too few calls): a tail made of preempted calls waited for a CPU, not for the network."""
    if p99 is None or not all(len(e.get("switches", ())) == len(per_iter) for e in entries):
        return {}
    sw = np.bitwise_or.reduce(np.array([e["switches"] for e in entries], dtype=np.int64), axis=0)
    slow = per_iter >= p99
    return {"calls_slept": int(np.count_nonzero(sw & 1)), "calls_preempted": int(np.count_nonzero(sw & 2)),
            "slowest_1pct": int(np.count_nonzero(slow)), "slowest_1pct_slept": int(np.count_nonzero(sw[slow] & 1)),
            "slowest_1pct_preempted": int(np.count_nonzero(sw[slow] & 2))}


# A percentile means something only with enough calls past it: p99 from 100 timed calls, p99.9
# from 1000 (fewer: the row says "-", and the table says why).
TAIL_MIN_ITERS = {99: 100, 99.9: 1000}


def tail(times: np.ndarray, pct: float) -> float | None:
    return float(np.percentile(times, pct)) if len(times) >= TAIL_MIN_ITERS[pct] else None


def histogram(times: np.ndarray) -> dict[str, int]:
    """Counts of call times in log-spaced bins, 10 a decade: {upper edge in seconds: count},
    empty bins left out. Enough to redraw the distribution or merge launches later."""
    edges = 10.0 ** (np.arange(-60, 21) / 10)  # 1 us .. 100 s
    counts = np.histogram(np.clip(times, edges[0], edges[-1]), bins=edges)[0]
    return {f"{hi:.3g}": int(c) for hi, c in zip(edges[1:], counts) if c}


def mean_chunk_bytes(entries: list[dict]) -> int | None:
    """r2cc: bytes per data chunk over the timed ops (its chunks follow the rails' speed)."""
    chunks = sum(e.get("chunks_sent", 0) for e in entries)
    return int(sum(e.get("chunk_bytes_sent", 0) for e in entries) / chunks) if chunks else None


def summarize_fault(backend: str, spec_text: str, size: int, entries: list[dict | None],
                    injected: dict | None, baseline_s: float | None, baseline_kind: str) -> dict:
    done = [e for e in entries if e is not None]
    completed = len(done) == len(entries) and all(e.get("completed") for e in done)
    fault_s = max(e["elapsed_s"] for e in done) if completed else None
    errors = [e.get("error") for e in done if e.get("error")]
    if len(done) < len(entries):
        errors.append("rank produced no result (killed: no progress before the bench timeout)")
    ends = [e.get("end") for e in done]
    inj = (injected or {}).get("injected_at")
    # The fault hit the op unless every rank had finished before it was surely in place.
    hit = inj is not None and (len(done) < len(entries) or None in ends or inj < max(ends))
    row = {"backend": backend, "spec": spec_text, "bytes": size, "completed": completed,
           "bit_exact": all(e.get("bit_exact") for e in done) if completed else None,
           "correct": all(e.get("correct") for e in done) if completed else None,
           "fault_s": fault_s, "baseline_s": baseline_s, "baseline": baseline_kind,
           "extra_s": fault_s - baseline_s if completed and baseline_s is not None else None,
           "resent_bytes": int(sum(e.get("resent_bytes") or 0 for e in done)),
           # False: the op ended before the fault landed (too small to be hit at that point).
           "hit": bool(hit),
           "fault_at_s": (inj - injected["go"]) if inj is not None else None,
           "fault_call_s": (inj - injected["call_start"]) if inj is not None else None,
           "error": errors[0] if errors else (injected or {}).get("error")}
    detect = [e["detect_s"] for e in done if e.get("detect_s") is not None]
    if any("failovers" in e for e in done):  # r2cc: how the failed rail was detected (slowest rank)
        row.update(detect_s=max(detect) if detect else None, rail_failovers=sum(e.get("failovers", 0) for e in done),
                   rail_error=next((e["rail_error"] for e in done if e.get("rail_error")), None),
                   states_before=[e.get("states_before") for e in done])
    rec = [e for e in done if "recovered" in e]
    if rec:
        row.update(recovered=all(e["recovered"] for e in rec), recover_s=max(e["recover_s"] for e in rec))
    return row


def merge_reps(rows: list[dict]) -> dict:
    """One row from repeated faulted ops: medians of the times, every rep must pass."""
    if len(rows) == 1:
        return rows[0]
    out = dict(rows[0])
    done = all(r["completed"] for r in rows)
    times = [r["fault_s"] for r in rows]
    keep = ("fault_s", "extra_s", "resent_bytes", "hit", "fault_at_s", "detect_s", "rail_failovers",
            "states_before", "error")
    out.update(reps=len(rows), completed=done, runs=[{k: r.get(k) for k in keep} for r in rows],
               bit_exact=all(r["bit_exact"] for r in rows) if done else None,
               fault_s=float(np.median(times)) if done else None,
               fault_s_all=times, extra_s_all=[r["extra_s"] for r in rows],
               resent_bytes=int(np.median([r["resent_bytes"] for r in rows])),
               hit=all(r["hit"] for r in rows if r["fault_at_s"] is not None),  # reps never run: no say
               detect_s=max((r["detect_s"] for r in rows if r.get("detect_s") is not None), default=None),
               fault_at_s=_median([r["fault_at_s"] for r in rows if r["fault_at_s"] is not None]),
               error=next((r["error"] for r in rows if r["error"]), None))
    out["extra_s"] = out["fault_s"] - out["baseline_s"] if done and out["baseline_s"] is not None else None
    if "recover_s" in out:
        out.update(recovered=all(r.get("recovered") for r in rows),
                   recover_s=max(r.get("recover_s", 0.0) for r in rows))
    return out


def cpu_seconds_per_GB(entries: list[dict], size: int) -> float | None:
    """CPU seconds (user + system, every thread, from the OS) a rank spends per GB of its buffer
    put through the op, averaged over the ranks; None for results from before it was measured."""
    per_rank = [e["cpu_s"] / (len(e["times"]) * size / 1e9) for e in entries
                if e.get("cpu_s") is not None and e["times"] and size]
    return float(np.mean(per_rank)) if per_rank and len(per_rank) == len(entries) else None


def _median(xs: list[float]) -> float | None:
    return float(np.median(xs)) if xs else None


def add_free_extras(results: list[dict], faults: list[dict]) -> None:
    """Each fault row also gets its backend's fault-free p50 on every rail and the faulted op's
    time beyond it (extra_vs_free_s): the same yardstick for every backend. (r2cc's own extra_s
    is against r2cc on one rail fewer, which isolates the cost of detection and re-sending.)"""
    p50 = {(r["backend"], r["bytes"]): r["p50_s"] for r in results if not r.get("schedule") and r["p50_s"]}
    for f in faults:
        free = p50.get((f["backend"], f["bytes"]))
        f["free_p50_s"] = free
        f["extra_vs_free_s"] = f["fault_s"] - free if free is not None and f.get("fault_s") is not None else None


def add_ratios(results: list[dict]) -> None:
    """ratio_vs_r2cc = p50 / r2cc's p50 at the same size (> 1: r2cc is faster); r2cc's reference
    is its first row per size (its configured path, or the first --schedule)."""
    ref = {}
    for r in results:
        if r["backend"] == "r2cc" and r["p50_s"]:
            ref.setdefault(r["bytes"], r["p50_s"])
    for r in results:
        base = ref.get(r["bytes"])
        r["ratio_vs_r2cc"] = r["p50_s"] / base if base and r["p50_s"] else None


def _oneline(text: str) -> str:
    return " | ".join(line.strip() for line in str(text).splitlines() if line.strip())



def _num(x, fmt) -> str:
    return "-" if x is None else format(x, fmt)


def table(report: dict) -> str:
    build = report.get("build") or {}
    load = report.get("load_avg") or [float("nan")]
    where = (f"rails={','.join(report['rail_names'])} (existing hosts)" if report.get("rail_names")
             else f"rails={report['rails']} rate={report['rate'] or 'unshaped'} mtu={report['mtu']}")
    lines = [f"{report['op']}  hosts={report['hosts']} {where} iters={report['iters']}"
             + (f" warm-up>={report['warmup_s']:g}s" if report.get("warmup_s") else "") + "  "
             f"load={load[0]:.1f} core={build.get('core_sha256')} git={build.get('git_head')}"
             + ("+dirty csrc" if build.get("csrc_dirty") else "")
             + (f"  r2cc spin_us={report['spin_us']}" if report.get("spin_us") is not None else ""),
             f"{'backend':14} {'bytes':>6} {'p50 ms':>10} {'p90 ms':>10} {'p99 ms':>10} {'p99.9 ms':>10} {'max ms':>10} "
             f"{'busbw GB/s':>10} "
             f"{'CPU s/GB':>9} {'correct':>8} {'p50/r2cc':>8}  rails tx share"]
    for r in report["results"]:
        share = "/".join(f"{x * 100:.0f}" for x in r.get("rail_tx_share") or [])
        correct = ("exact" if r.get("bit_exact") else "yes") if r["correct"] else "NO"
        name = r["backend"] + (f":{r['schedule']}" if r.get("schedule") else "")
        lines.append(f"{name:14} {format_size(r['bytes']):>6} {_ms(r['p50_s']):>10} {_ms(r['p90_s']):>10} "
                     f"{_ms(r.get('p99_s')):>10} {_ms(r.get('p999_s')):>10} {_ms(r.get('max_s')):>10} "
                     f"{_num(r['busbw_GBps'], '.3f'):>10} {_num(r.get('cpu_s_per_GB'), '.3g'):>9} {correct:>8} "
                     f"{_num(r['ratio_vs_r2cc'], '.2f'):>8}  {share}"
                     + (f"  mean chunk {r['mean_chunk_bytes'] / 1024:.0f}K" if r.get("mean_chunk_bytes") else "")
                     + (f"  slowest 1%: {r['slowest_1pct_preempted']}/{r['slowest_1pct']} a caller preempted, "
                        f"{r['slowest_1pct_slept']} slept" if r.get("slowest_1pct") else "")
                     + (f"  error: {_oneline(r['error'])}" if r.get("error") else "")
                     + (f"  ({r['failovers']} failovers, {r['resent_bytes']} B re-sent without a fault)"
                        if r.get("failovers") or r.get("resent_bytes") else ""))
    for x in report.get("skipped") or []:
        lines.append(f"{x['backend']:14} skipped: {x['reason']}")
    lines += first_calls_table(report["results"])
    short = [f"p{p:g} needs {n} timed calls" for p, n in TAIL_MIN_ITERS.items() if report["iters"] < n]
    if short:
        lines.append(f"({'; '.join(short)} (--iters): '-' below that; the JSON keeps every row's histogram)")
    if report.get("schedules"):
        from r2cc_testbed.bench.expect import schedule_table
        lines += ["", schedule_table(report)]
    if report["faults"]:
        lines.append("")
        lines.append(f"{'backend':11} {'bytes':>6} {'fault':24} {'done':>5} {'exact':>5} {'fault ms':>9} "
                     f"{'base ms':>9} {'extra ms':>9} {'vs free':>9} {'resent':>10}  notes")
        for f in report["faults"]:
            notes = [f"baseline={f['baseline']}"]
            if not f["hit"]:
                notes.append("fault landed after the op")
            if f.get("reps"):
                notes.append(f"median of {f['reps']} (extra ms: "
                             + ", ".join(_ms(x) for x in f["extra_s_all"]) + ")")
            if f["fault_at_s"] is not None:
                notes.append(f"fault in place at +{f['fault_at_s'] * 1e3:.0f} ms")
            if f.get("detect_s") is not None:
                notes.append(f"detected in {f['detect_s'] * 1e3:.0f} ms")
            if "recover_s" in f:
                notes.append(f"rails back after {f['recover_s']:.2f}s" if f["recovered"] else "rails NOT back")
            if f.get("kernel_mptcp") is not None:
                k = f["kernel_mptcp"]
                notes.append("kernel MPTCP: " + ", ".join(f"{name} {k.get(key, 0)}" for name, key in (
                    ("subflows stale", "SubflowStale"), ("recovered", "SubflowRecover"),
                    ("re-injected", "MPTCPRetrans"), ("subflows removed", "RmSubflow"))))
            if f["error"]:
                notes.append(f"error: {_oneline(f['error'])[:160]}")
            exact = "-" if f["bit_exact"] is None else ("yes" if f["bit_exact"] else "NO")
            lines.append(f"{f['backend']:11} {format_size(f['bytes']):>6} {f['spec']:24} "
                         f"{'yes' if f['completed'] else 'NO':>5} {exact:>5} {_ms(f['fault_s']):>9} "
                         f"{_ms(f['baseline_s']):>9} {_ms(f['extra_s']):>9} {_ms(f.get('extra_vs_free_s')):>9} "
                         f"{f['resent_bytes']:>10}  "
                         + "; ".join(notes))
        lines.append("extra ms: the faulted op beyond `base ms` (see baseline=); vs free: beyond the backend's own "
                     "fault-free p50 in this launch, the same yardstick for every backend")
    return "\n".join(lines)


def first_calls_table(results: list[dict]) -> list[str]:
    """Lines for the rows that timed a fresh group's first calls (--first-calls), with each
    backend's p50 against r2cc's; [] when none did."""
    rows = [r for r in results if r.get("first_calls") and not r.get("schedule")]
    if not rows:
        return []
    ref = next((r["first_calls"]["p50_s"] for r in rows if r["backend"] == "r2cc"), None)
    lines = ["", f"first calls of a fresh group, before any warm-up ({rows[0]['first_calls']['n']} calls):",
             f"{'backend':14} {'bytes':>6} {'call 1 ms':>10} {'p50 ms':>10} {'p99 ms':>10} {'max ms':>10} {'p50/r2cc':>8}"]
    for r in rows:
        f = r["first_calls"]
        lines.append(f"{r['backend']:14} {format_size(r['bytes']):>6} {_ms(f['first_s']):>10} {_ms(f['p50_s']):>10} "
                     f"{_ms(f['p99_s']):>10} {_ms(f['max_s']):>10} "
                     f"{_num(f['p50_s'] / ref if ref else None, '.2f'):>8}")
    return lines


def rate_table(reports: list[dict]) -> str:
    """Bus bandwidth against rail rate, every backend side by side (one report per rate);
    'line' is one rank's rails together, the most a rank's bus bandwidth can reach."""
    from r2cc_serve.util.rates import rate_bits

    first = reports[0]
    backends = list(dict.fromkeys(r["backend"] for rep in reports for r in rep["results"]))
    head = f"{'rate':>9} {'bytes':>6} {'line GB/s':>9}" + "".join(
        f" {b + ' busbw':>16} {'CPU s/GB':>8}" for b in backends)
    others = [b for b in backends if b != "r2cc"] if "r2cc" in backends else []
    head += "".join(f" {'r2cc/' + b:>9}" for b in others)
    lines = [f"bus bandwidth against rail rate: {first['op']}, {first['hosts']} hosts x {first['rails']} rails, "
             f"mtu {first['mtu']}", head]
    for rep in reports:
        line = rep["rails"] * rate_bits(rep["rate"]) / 8 / 1e9 if rep["rate"] else None
        for size in dict.fromkeys(r["bytes"] for r in rep["results"]):
            rows = {r["backend"]: r for r in rep["results"] if r["bytes"] == size and not r.get("schedule")}
            text = f"{rep['rate'] or 'unshaped':>9} {format_size(size):>6} {_num(line, '.3f'):>9}"
            for b in backends:
                bw = (rows.get(b) or {}).get("busbw_GBps")
                share = f" ({bw / line:.0%})" if bw and line else ""
                text += f" {_num(bw, '.3f') + share:>16} {_num((rows.get(b) or {}).get('cpu_s_per_GB'), '.3g'):>8}"
            for b in others:
                mine, theirs = (rows.get("r2cc") or {}).get("busbw_GBps"), (rows.get(b) or {}).get("busbw_GBps")
                text += f" {(f'{mine / theirs:.2f}x' if mine and theirs else '-'):>9}"
            lines.append(text)
    return "\n".join(lines)


def spin_table(reports: list[dict]) -> str:
    """Latency and CPU against R2CC_SPIN_US (one report per value, same rate): what spinning buys
    and what it costs, with every other backend's p50 from the same run beside it."""
    first = reports[0]
    backends = list(dict.fromkeys(r["backend"] for rep in reports for r in rep["results"]))
    others = [b for b in backends if b != "r2cc"]
    head = (f"{'spin_us':>7} {'bytes':>6} {'r2cc p50 ms':>11} {'CPU s/GB':>8} {'spins hit/miss/skip':>19}"
            + "".join(f" {b + ' p50 ms':>11} {b + '/r2cc':>9}" for b in others))
    lines = [f"r2cc against spinning (R2CC_SPIN_US): {first['op']}, {first['hosts']} hosts x {first['rails']} rails, "
             f"rate {first['rate'] or 'unshaped'}", head]
    for rep in reports:
        for size in dict.fromkeys(r["bytes"] for r in rep["results"]):
            rows = {r["backend"]: r for r in rep["results"] if r["bytes"] == size and not r.get("schedule")}
            mine = rows.get("r2cc") or {}
            spins = (f"{mine.get('spin_hits', 0)}/{mine.get('spin_misses', 0)}/{mine.get('spin_skips', 0)}"
                     if mine else "-")
            text = (f"{rep.get('spin_us', '-'):>7} {format_size(size):>6} {_ms(mine.get('p50_s')):>11} "
                    f"{_num(mine.get('cpu_s_per_GB'), '.3g'):>8} {spins:>19}")
            for b in others:
                theirs = (rows.get(b) or {}).get("p50_s")
                ratio = f"{theirs / mine['p50_s']:.2f}x" if theirs and mine.get("p50_s") else "-"
                text += f" {_ms(theirs):>11} {ratio:>9}"
            lines.append(text)
    return "\n".join(lines)

