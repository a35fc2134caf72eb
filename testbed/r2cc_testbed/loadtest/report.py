"""report.md, report.json and the figures, from the saved results of a run (never from memory,
so `r2cc loadtest report DIR` gives the same report as the run that wrote DIR)."""

from __future__ import annotations

import glob
import json
import os
import time

from r2cc_serve.errors import UserError
from r2cc_testbed.loadtest import figures
from r2cc_testbed.loadtest.analysis import analyse
from r2cc_testbed.loadtest.runner import RESULT_FILE
from r2cc_testbed.loadtest.scenario import METRICS
from r2cc_testbed.loadtest.intervals import MIN_PAIRS
from r2cc_serve.util.durations import millis, seconds

HEADLINE = (("tpot", "p99"), ("e2el", "p99"), ("itl", "p99"), ("ttft", "p99"))


def find_results(out_dir: str) -> list[str]:
    """result.json of a scenario folder, or of every scenario folder under a run folder."""
    own = os.path.join(out_dir, RESULT_FILE)
    found = [own] if os.path.isfile(own) else sorted(glob.glob(os.path.join(out_dir, "*", RESULT_FILE)))
    if not found:
        raise UserError(f"no {RESULT_FILE} in {out_dir} or its sub-folders: is it the --out folder of a run?")
    return found


def write_report(out_dir: str, with_figures: bool = True) -> str:
    """Render report.md and report.json into out_dir; returns the path of report.md."""
    sections, analyses = [], []
    for path in find_results(out_dir):
        try:
            with open(path) as f:
                result = json.load(f)
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot read {path}: {exc}") from None
        a = analyse(result)
        scen_dir = os.path.dirname(path)
        pngs = figures.render(result, scen_dir) if with_figures else []
        a["figures"] = [os.path.relpath(os.path.join(scen_dir, p), out_dir) for p in pngs]
        analyses.append(a)
        sections.append(scenario_md(a))
    doc = {"generated": time.strftime("%Y-%m-%d %H:%M:%S"), "summary": summary_rows(analyses), "scenarios": analyses}
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(doc, f, indent=1, default=str)
    md = os.path.join(out_dir, "report.md")
    with open(md, "w") as f:
        f.write(_head(analyses) + summary_md(doc["summary"]) + "\n" + "\n".join(sections))
    return md


def _head(analyses: list[dict]) -> str:
    return ("# r2cc load test report\n\n"
            f"Scenarios: {', '.join(a['scenario']['name'] for a in analyses)}. Load from `vllm bench serve` "
            "(greedy, fixed seed); fault-free and faulted rounds interleaved with the same prompts. "
            "Overhead = geometric mean over pairs of (percentile of the faulted round / percentile of its "
            "fault-free round) - 1, with a 95% bootstrap interval (pairs of rounds, then requests, drawn with "
            "replacement). Fault times are when "
            "the fault daemon applied them; lag = applied - scheduled.\n\n")


# --- summary ------------------------------------------------------------------------------------

def summary_rows(analyses: list[dict]) -> list[dict]:
    rows = []
    for a in analyses:
        for backend, b in a["backends"].items():
            row = {"scenario": a["scenario"]["name"], "backend": backend, "ok": b["ok"], "failed": b["failed"],
                   "unfinished": b["unfinished_rounds"], "outputs": outputs_verdict(b),
                   "lag_max_s": b["fault_timing"].get("lag_max_s"),
                   "in_effect_max_s": b["fault_timing"].get("in_effect_max_s"), "stall_s": _worst_stall(b),
                   "gap_max_s": longest_gap(b, "fault"), "gap_max_free_s": longest_gap(b, "free")}
            for m, p in HEADLINE[:2]:
                row[f"{m}_{p}"] = b["overheads"][m][p]
            rows.append(row)
    return rows


def summary_md(rows: list[dict]) -> str:
    out = ["## Summary", "",
           "| scenario | backend | requests ok / failed | rounds cut short | outputs | p99 TPOT overhead [95% CI] "
           "| p99 E2EL overhead [95% CI] | longest token gap, faulted / fault-free | longest stall "
           "| max fault lag (started / done) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        only = " (finished requests only)" if r["failed"] else ""
        out.append(f"| {r['scenario']} | {r['backend']} | {r['ok']} / {r['failed']} | "
                   f"{', '.join(r['unfinished']) or 'none'} | {r['outputs']} | {_ci_undecided(r['tpot_p99'])}{only} | "
                   f"{_ci_undecided(r['e2el_p99'])}{only} | {seconds(r['gap_max_s'])} / {seconds(r['gap_max_free_s'])} | "
                   f"{seconds(r['stall_s'])} | {millis(r['lag_max_s'], 1)} / "
                   f"{millis(r.get('in_effect_max_s'), 1)} |")
    return "\n".join(out) + "\n"


def outputs_verdict(b: dict) -> str:
    pairs = b["outputs"]["faulted_vs_fault_free"]
    if not pairs:
        return "not compared"
    compared, differ = sum(p["compared"] for p in pairs), sum(p["differ"] for p in pairs)
    return "identical" if differ == 0 and compared else f"{differ} of {compared} differ"


def longest_gap(b: dict, kind: str) -> float | None:
    """The longest inter-token gap of any request in the rounds of this kind (fault or free)."""
    gaps = [r["itl_max_s"] for r in b["rounds"] if r["kind"] == kind and r.get("itl_max_s") is not None]
    return max(gaps) if gaps else None


def _worst_stall(b: dict) -> float | None:
    lengths = [s["length_s"] for r in b["rounds"] for s in r["stalls"]]
    return max(lengths) if lengths else None


# --- one scenario ---------------------------------------------------------------------------------

def scenario_md(a: dict) -> str:
    sc = a["scenario"]
    load = sc["load"]
    rate = (f"{load['saturation_fraction']:.0%} of saturation" if load["saturation_fraction"] else
            f"{load['request_rate']} req/s" if load["request_rate"] else f"{load['concurrency']} in flight")
    out = [f"## {sc['name']}", "", sc["description"], "",
           f"- deployment: {sc['shape']}, TP=2, backends {', '.join(sc['backends'])}; lab {sc['hosts']} hosts x "
           f"{sc['rails']} rails at {sc['rate']}",
           f"- load: {load['dataset']} prompts, {load['input_len']} in / {load['output_len']} out tokens, {rate}, "
           f"seed {load['seed']}; {sc['method']['pairs']} pairs of rounds" + (" (--quick)" if sc.get("quick") else ""),
           "- faults: " + ("; ".join(f"at {e['at']:g} s {e['do']}" for e in sc["schedule"]) or "none")]
    if sc.get("reference"):
        out.append("- reference rounds (the \"fault-free\" ones, which overheads compare against) hold: "
                   + "; ".join(f"at {e['at']:g} s {e['do']}" for e in sc["reference"]))
    out.append("")
    out += [f"![{os.path.basename(p)}]({p})" for p in a.get("figures", [])] + [""]
    for backend, b in a["backends"].items():
        out += backend_md(backend, b, sc)
    out += _cross_backend_md(a)
    return "\n".join(out) + "\n"


def backend_md(backend: str, b: dict, sc: dict) -> list[str]:
    load = b.get("load") or {}
    out = [f"### {backend}", ""]
    if b.get("deploy"):
        out.append(f"Started in {b['deploy'].get('startup_s')} s; rounds of {load.get('requests')} requests"
                   + (f" at {load['request_rate']:.3g} req/s" if load.get("request_rate") else
                      f", {load.get('concurrency')} in flight")
                   + (f" (saturation {b['saturation_req_s']:.3g} req/s)" if b.get("saturation_req_s") else "")
                   + f"; fault daemon at {b.get('fault_daemon')}.")
    out += [f"- note: {n}" for n in b["notes"]]
    out += ["", "| round | ok | failed | ended | E2EL p50 / p99 | TPOT p50 / p99 | ITL p99 / max | TTFT p99 "
            "| longest stall | load avg |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in b["rounds"]:
        stall = max((s["length_s"] for s in r["stalls"]), default=None)
        out.append(f"| {r['round']} | {r['ok']} | {r['failed']} | {r['ended']} | {seconds(r['e2el_p50_s'])} / "
                   f"{seconds(r['e2el_p99_s'])} | {millis(r['tpot_p50_s'])} / {millis(r['tpot_p99_s'])} | "
                   f"{millis(r['itl_p99_s'])} / {millis(r.get('itl_max_s'))} | {seconds(r['ttft_p99_s'])} | {seconds(stall)} | "
                   f"{r['loadavg'][0]:.1f}-{r['loadavg'][1]:.1f} |")
    errors = [f"{r['round']}: {r['first_error']}" for r in b["rounds"] if r["first_error"]]
    errors += [f"{r['round']}: at {f['t']:.1f} s {f['what']}" for r in b["rounds"] for f in r["failures"]]
    out += [""] + [f"- failure: {e}" for e in errors[:6]]
    out += ["", "Overhead of the faulted rounds (95% bootstrap interval):", "",
            "| metric | p50 | p90 | p99 |", "|---|---|---|---|"]
    for m in METRICS:
        cells = [f"{_ci(b['overheads'][m][p])} {b['overheads'][m][p]['verdict']}" for p in ("p50", "p90", "p99")]
        out.append(f"| {m.upper()} | " + " | ".join(cells) + " |")
    pairs = max((o["pairs"] for m in METRICS for o in b["overheads"][m].values()), default=0)
    if pairs == 1:
        out += ["", "One pair only: the interval shows the spread within a round, not from round to round."]
    out += ["", *_outputs_md(b), *_faults_md(b, backend), ""]
    return out


def _outputs_md(b: dict) -> list[str]:
    o = b["outputs"]
    out = [f"- outputs of the faulted rounds vs their fault-free rounds: {outputs_verdict(b)}"]
    for p in o["faulted_vs_fault_free"]:
        if p["differ"]:
            out.append(f"  - pair {p['pair']}: requests {p['requests']} differ (first from character "
                       f"{p['first']['from_char']})")
    floor = sum(p["differ"] for p in o["fault_free_vs_first"])
    if o["fault_free_vs_first"]:
        out.append(f"- fault-free rounds against each other (the batching noise floor): {floor} differ")
    if "serial_faulted_vs_fault_free" in o:
        s = o["serial_faulted_vs_fault_free"]
        out.append(f"- one request at a time (no batching), faulted vs fault-free: "
                   + ("identical" if not s["differ"] else f"{s['differ']} of {s['compared']} differ")
                   + (": the differences above come from batching, not the communicator" if not s["differ"] else ""))
    return out


def _faults_md(b: dict, backend: str) -> list[str]:
    t = b["fault_timing"]
    if not t:
        return []
    out = [f"- fault steps: {t['steps']}, lag (applied - scheduled) p50 {millis(t['lag_p50_s'], 2)}, max "
           f"{millis(t['lag_max_s'], 2)}; applying took p50 {millis(t['apply_p50_s'], 2)}, max {millis(t['apply_max_s'], 2)}; "
           f"the kernel's link state showed it for {t['kernel_seen']} steps, p50 {millis(t['kernel_seen_p50_s'], 1)} "
           f"after (max {millis(t['kernel_seen_max_s'], 1)})"]
    out += [f"- fault step error: {e}" for e in t["errors"][:5]]
    for d in b["detection"]:
        for row in d["steps"]:
            if backend != "r2cc" and "detected_s" in row:
                continue  # only r2cc reports rail states
            if backend != "r2cc":
                what = "bytes on the rail again after " + millis(row["bytes_again_s"])
            elif "detected_s" in row:
                what = (f"detected after {millis(row['detected_s'])} (rail {row['state']})" if row["detected_s"] is not None
                        else "no rail state change seen")
            else:
                what = (f"rail up after {millis(row['back_up_s'])}" if row["back_up_s"] is not None else "no 'up' event") + \
                       ", bytes on it again after " + millis(row["bytes_again_s"])
            out.append(f"- pair {d['pair']}: {row['step']} at {row['at_s']:.2f} s: {what}")
    bytes_ = next((r["rail_bytes"] for r in b["rounds"] if r["kind"] == "fault"), None)
    if bytes_:
        src = bytes_["r2cc_sent"] or bytes_["nic_host0"]
        label = "r2cc bytes sent" if bytes_["r2cc_sent"] else "host 0 interface bytes"
        lab_rails = b.get("lab_rails", 0)
        out.append(f"- {label} per rail in faulted-1: " + ", ".join(
            f"rail{k}{' (fallback)' if lab_rails and k >= lab_rails else ''} {v / 1e6:.1f} MB"
            for k, v in sorted((int(k), v) for k, v in src.items())))
    return out


def _cross_backend_md(a: dict) -> list[str]:
    out = []
    for other, o in a["outputs"].items():
        out += [f"### r2cc against {other}", ""]
        c = o.get("fault_free")
        if c:
            out.append("- fault-free outputs, request by request: " +
                       ("identical" if not c["differ"] else f"{c['differ']} of {c['compared']} differ"))
        s = o.get("serial")
        if s:
            out.append("- one request at a time (no batching): " +
                       ("identical" + (": the differences above come from batching" if c and c["differ"] else "")
                        if not s["differ"] else f"{s['differ']} of {s['compared']} differ"))
        out.append("")
    return out


def _ci_undecided(o: dict | None) -> str:
    """_ci, saying so when too few pairs ran for the interval to mean anything (stats.MIN_PAIRS)."""
    few = o and o.get("overhead") is not None and o.get("pairs", MIN_PAIRS) < MIN_PAIRS
    return _ci(o) + (f" ({o['pairs']} pair: not decided)" if few else "")


def _ci(o: dict | None) -> str:
    if not o or o.get("overhead") is None:
        return "-"
    if o.get("low") is None:
        return f"{o['overhead']:+.1%}"
    return f"{o['overhead']:+.1%} [{o['low']:+.1%}, {o['high']:+.1%}]"


