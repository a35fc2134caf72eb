"""From saved rounds to the numbers of the report. Pure: works on result.json alone.

    analyse(result) -> {"scenario": ..., "backends": {name: {...}}, "outputs": {...}}
"""

from __future__ import annotations

from r2cc_testbed.faults.model import HELD_KINDS, parse_fault_text
from r2cc_testbed.loadtest.bench_serve import Request
from r2cc_testbed.loadtest.rounds import Round
from r2cc_testbed.loadtest.scenario import METRICS, PERCENTILES
from r2cc_testbed.loadtest.intervals import Units, overheads, percentile, verdict
from r2cc_serve.util.durations import millis, seconds

BREAKS = HELD_KINDS  # every fault or action that clear, undrain or restore ends (lossy, gray, marginal too)
REPAIRS = ("up", "clear", "undrain", "restore")
STALL_S = 2.0  # no new token for this long with requests running is a stall worth reporting


# --- per request ----------------------------------------------------------------------------------

def metric_groups(requests: list[Request], metric: str) -> list[list[float]]:
    """Values of a metric grouped by request (ITL: every gap; the others: one value)."""
    out = []
    for r in requests:
        if not r.ok:
            continue
        if metric == "itl":
            out.append(list(r.itls_s))
        else:
            v = {"ttft": r.ttft_s, "tpot": r.tpot_s, "e2el": r.e2el_s}[metric]
            if v is not None:
                out.append([v])
    return out


def compare_outputs(a: list[Request], b: list[Request]) -> dict:
    """Request by request (same index = same prompt): how many both finished and how many differ."""
    both = [(x, y) for x, y in zip(a, b) if x.ok and y.ok]
    differ = [x.index for x, y in both if x.text != y.text]
    first = None
    if differ:
        x, y = a[differ[0]], b[differ[0]]
        first = {"request": differ[0], "from_char": next((i for i, (c, d) in enumerate(zip(x.text, y.text)) if c != d),
                                                          min(len(x.text), len(y.text)))}
    return {"compared": len(both), "differ": len(differ), "requests": differ[:20], "first": first}


# --- per round ------------------------------------------------------------------------------------

def round_summary(rnd: Round) -> dict:
    ok = [r for r in rnd.requests if r.ok]
    failed = [r for r in rnd.requests if not r.ok]
    s = {"round": _name(rnd), "kind": rnd.plan["kind"], "pair": rnd.plan["pair"], "ended": rnd.ended,
         "requests": len(rnd.requests), "ok": len(ok), "failed": len(failed),
         "first_error": failed[0].error if failed else "", "duration_s": rnd.duration_s,
         "loadavg": list(rnd.loadavg), "schedule": rnd.schedule_outcome}
    for m in METRICS:
        flat = [v for g in metric_groups(rnd.requests, m) for v in g]
        for p in PERCENTILES:
            s[f"{m}_p{p}_s"] = percentile(flat, p)
    # The longest wait for a next token by any request: what a fault costs a user at worst.
    s["itl_max_s"] = max((v for g in metric_groups(rnd.requests, "itl") for v in g), default=None)
    s["stalls"] = stalls(rnd)
    s["failures"] = rnd.failures
    s["rail_bytes"] = rail_bytes(rnd)
    return s


def round_line(rnd: Round) -> str:
    """One progress line."""
    s = round_summary(rnd)
    line = (f"{s['round']}: {s['ok']}/{s['requests']} ok, {s['failed']} failed, E2EL p99 {seconds(s['e2el_p99_s'])}, "
            f"TPOT p99 {millis(s['tpot_p99_s'])}, ended {s['ended']}")
    if rnd.steps:
        lags = [st["started"] - st["due"] for st in rnd.steps]
        in_effect = [st["done"] - st["due"] for st in rnd.steps if st.get("done") is not None]
        line += f"; {len(rnd.steps)} fault steps, max lag {max(lags) * 1000:.1f} ms" + (
            f" (done {max(in_effect) * 1000:.1f} ms after due)" if in_effect else "")
    if s["stalls"]:
        worst = max(s["stalls"], key=lambda x: x["length_s"])
        line += f"; no token for {worst['length_s']:.1f} s from t={worst['from_s']:.1f} s"
    if s["first_error"]:
        line += f"; first error: {s['first_error'][:120]}"
    return line


def stalls(rnd: Round) -> list[dict]:
    """Stretches with requests running or waiting and no new token (from the 0.5 s samples)."""
    out, since, last = [], None, None
    for m in rnd.metrics:
        if m.get("tokens") is None:
            continue
        busy = (m.get("running") or 0) + (m.get("waiting") or 0) > 0
        if last is not None and m["tokens"] <= last["tokens"] and busy:
            since = last["t"] if since is None else since
        else:
            if since is not None and m["t"] - since >= STALL_S:
                out.append({"from_s": since, "length_s": m["t"] - since})
            since = None
        last = m
    if since is not None and last is not None and last["t"] - since >= STALL_S:
        out.append({"from_s": since, "length_s": last["t"] - since, "open": True})
    return out


def rail_bytes(rnd: Round) -> dict:
    """Bytes per rail over the round: r2cc's counters (both hosts' sends) and host 0's interfaces."""
    def delta(samples, key):
        got = [s[key] for s in samples if s.get(key)]
        if len(got) < 2:
            return {}
        return {int(k): got[-1][k] - got[0].get(k, 0) for k in got[-1]}

    return {"r2cc_sent": delta(rnd.metrics, "rail_sent"), "nic_host0": delta(rnd.nics, "rails")}


def rail_rates(samples: list[dict], key: str) -> dict[int, list[tuple[float, float]]]:
    """{rail: [(t, bytes/s)]} from cumulative counters sampled over time."""
    out: dict[int, list[tuple[float, float]]] = {}
    prev = None
    for s in samples:
        cur = s.get(key) or {}
        if prev is not None and cur and s["t"] > prev["t"]:
            for k, v in cur.items():
                before = (prev.get(key) or {}).get(k)
                if before is not None:
                    out.setdefault(int(k), []).append((s["t"], (v - before) / (s["t"] - prev["t"])))
        if cur:
            prev = s
    return out


# --- faults ---------------------------------------------------------------------------------------

def fault_timing(rounds: list[Round]) -> dict:
    """How late the fault steps landed (started - due) and how long they took, over faulted rounds."""
    steps = [st for r in rounds for st in r.steps]
    if not steps:
        return {}
    lags = [st["started"] - st["due"] for st in steps]
    took = [st["done"] - st["started"] for st in steps]
    seen = [st["observed"] - st["started"] for st in steps if st.get("observed") is not None]
    in_effect = [st["done"] - st["due"] for st in steps]
    return {"steps": len(steps), "lag_p50_s": percentile(lags, 50), "lag_max_s": max(lags),
            "in_effect_max_s": max(in_effect),
            "apply_p50_s": percentile(took, 50), "apply_max_s": max(took),
            "kernel_seen": len(seen), "kernel_seen_p50_s": percentile(seen, 50),
            "kernel_seen_max_s": max(seen) if seen else None,
            "errors": [f"{st['label']}: {st['error']}" for st in steps if st.get("error")]}


def fault_windows(rnd: Round, lab_rails: int) -> list[dict]:
    """[{from_s, to_s, label}]: from each breaking step to the step that repairs it (actual times)."""
    specs = [parse_fault_text(e["do"]) for e in rnd.plan.get("schedule", [])]
    spans: dict[tuple[float, str], float] = {}    # (start, label) -> end
    broken: dict[tuple[int, int], tuple[float, str]] = {}  # (host, rail) -> (start, label)
    flaps: dict[int, tuple[float, str]] = {}               # schedule entry -> (start, label)
    for st in sorted(rnd.steps, key=lambda s: s["started"]):
        spec = specs[st["entry"]]
        label = f"{spec.action} {spec.target}"
        if spec.kind == "flap":  # one window from its first step to its last
            first, _ = flaps.get(st["entry"], (st["started"], label))
            flaps[st["entry"]] = (first, label)
            spans[(first, label)] = st["done"]
            continue
        rails = range(lab_rails) if st["rail"] is None else [st["rail"]]
        for k in rails:
            if st["kind"] in BREAKS:
                broken.setdefault((st["host"], k), (st["started"], label))
            elif st["kind"] in REPAIRS and (st["host"], k) in broken:
                opened = broken.pop((st["host"], k))
                spans[opened] = max(spans.get(opened, st["started"]), st["started"])
    end = rnd.duration_s or max((m["t"] for m in rnd.metrics), default=0.0)
    out = [{"from_s": a, "to_s": b, "label": label} for (a, label), b in spans.items()]
    out += [{"from_s": a, "to_s": end, "label": label + " (not repaired)"} for a, label in set(broken.values())]
    return sorted(out, key=lambda w: w["from_s"])


def detection_and_recovery(rnd: Round, backend: str, lab_rails: int) -> list[dict]:
    """Per step that breaks or repairs a rail: when r2cc saw it (events) and when bytes flowed again.
    A flap counts as its first step (break) and its last (repair)."""
    rates = rail_rates(rnd.metrics, "rail_sent") if backend == "r2cc" else rail_rates(rnd.nics, "rails")
    by_entry: dict[int, list[dict]] = {}
    for st in rnd.steps:
        by_entry.setdefault(st["entry"], []).append(st)
    out = []
    for st in sorted(rnd.steps, key=lambda s: s["started"]):
        group = by_entry[st["entry"]]
        if st.get("error") or (len(group) > 1 and st is not group[0] and st is not group[-1]):
            continue
        rails = list(range(lab_rails)) if st["rail"] is None else [st["rail"]]
        row = {"step": st["label"], "at_s": st["started"]}
        after = [e for e in rnd.events if e.get("rail") in rails and e["t"] >= st["started"] - 0.05]
        if st["kind"] in BREAKS or (len(group) > 1 and st is group[0]):
            ev = next((e for e in after if e.get("to") != "up"), None)
            row["detected_s"] = None if ev is None else ev["t"] - st["started"]
            row["state"] = None if ev is None else ev.get("to")
        elif st["kind"] in REPAIRS:
            ev = next((e for e in after if e.get("to") == "up"), None)
            row["back_up_s"] = None if ev is None else ev["t"] - st["started"]
            row["bytes_again_s"] = _bytes_again(rates, rails, st["started"])
        else:
            continue
        out.append(row)
    return out


def _bytes_again(rates: dict, rails: list[int], since: float) -> float | None:
    """First sample after `since` in which every one of the rails moved bytes, minus `since`."""
    times = []
    for k in rails:
        t = next((t for t, v in rates.get(k, []) if t > since and v > 0), None)
        if t is None:
            return None
        times.append(t)
    return max(times) - since


# --- per backend and scenario -----------------------------------------------------------------------

def rounds_of(entry: dict, key: str = "rounds") -> list[Round]:
    return [Round.from_dict(r) for r in entry.get(key, [])]


def pairs_of(rounds: list[Round]) -> list[tuple[Round, Round]]:
    free = {r.plan["pair"]: r for r in rounds if r.plan["kind"] == "free"}
    return [(free[r.plan["pair"]], r) for r in rounds if r.plan["kind"] == "fault" and r.plan["pair"] in free]


def self_mismatches(entry: dict) -> int:
    """Requests whose output differs between a faulted round and its pair's fault-free round."""
    return sum(compare_outputs(a.requests, b.requests)["differ"] for a, b in pairs_of(rounds_of(entry)))


def analyse_backend(entry: dict, backend: str, targets: dict[str, float], n_boot: int, lab_rails: int) -> dict:
    rounds = rounds_of(entry)
    pairs = pairs_of(rounds)
    faulted = [b for _, b in pairs]
    out = {"rounds": [round_summary(r) for r in rounds], "notes": entry.get("notes", []), "lab_rails": lab_rails,
           "deploy": entry.get("deploy", {}), "load": entry.get("load", {}), "fault_daemon": entry.get("fault_daemon"),
           "saturation_req_s": (entry.get("saturation") or {}).get("summary", {}).get("request_throughput")}
    out["ok"] = sum(s["ok"] for s in out["rounds"])
    out["failed"] = sum(s["failed"] for s in out["rounds"])
    out["unfinished_rounds"] = [s["round"] for s in out["rounds"] if s["ended"] != "completed"]
    out["overheads"] = {}
    for m in METRICS:
        unit_pairs = [(Units(metric_groups(a.requests, m)), Units(metric_groups(b.requests, m))) for a, b in pairs]
        rows = overheads(unit_pairs, PERCENTILES, n_boot)
        out["overheads"][m] = {f"p{o.percentile}": {**o.to_dict(), "verdict": verdict(o, targets.get(f"{m}_p{o.percentile}")),
                                                    "target": targets.get(f"{m}_p{o.percentile}")} for o in rows}
    out["outputs"] = {
        "faulted_vs_fault_free": [{"pair": a.plan["pair"], **compare_outputs(a.requests, b.requests)} for a, b in pairs],
        "fault_free_vs_first": [{"pair": r.plan["pair"], **compare_outputs(pairs[0][0].requests, r.requests)}
                                for r, _ in pairs[1:]] if pairs else []}
    serial = {r.plan["kind"]: r for r in rounds_of(entry, "serial")}
    if "serial-free" in serial and "serial-fault" in serial:
        out["outputs"]["serial_faulted_vs_fault_free"] = compare_outputs(serial["serial-free"].requests,
                                                                         serial["serial-fault"].requests)
    out["fault_timing"] = fault_timing(faulted)
    out["detection"] = [{"pair": r.plan["pair"], "steps": detection_and_recovery(r, backend, lab_rails)} for r in faulted]
    return out


def analyse(result: dict) -> dict:
    sc = result["scenario"]
    n_boot = sc["method"]["bootstrap"]
    backends = {name: analyse_backend(entry, name, sc.get("targets") or {}, n_boot, sc["rails"])
                for name, entry in result["backends"].items()}
    outputs = {}
    r = result["backends"].get("r2cc")
    for other in (b for b in result["backends"] if b != "r2cc"):
        if r is None:
            break
        d = result["backends"][other]
        rp, dp = pairs_of(rounds_of(r)), pairs_of(rounds_of(d))
        cmp = {}
        if rp and dp:
            cmp["fault_free"] = compare_outputs(dp[0][0].requests, rp[0][0].requests)
        rs = {x.plan["kind"]: x for x in rounds_of(r, "serial")}
        ds = {x.plan["kind"]: x for x in rounds_of(d, "serial")}
        if "serial-free" in rs and "serial-free" in ds:
            cmp["serial"] = compare_outputs(ds["serial-free"].requests, rs["serial-free"].requests)
        if cmp:
            outputs[other] = cmp
    return {"scenario": sc, "started": result.get("started"), "finished": result.get("finished"),
            "backends": backends, "outputs": outputs}


def _name(rnd: Round) -> str:
    kind = {"free": "fault-free", "fault": "faulted"}.get(rnd.plan["kind"], rnd.plan["kind"])
    return f"{kind}-{rnd.plan['pair']}" if rnd.plan["pair"] else kind


