"""The admin API's view as text for the terminal (`r2cc rails`): a table of every rail, and a
line per thing the table's columns do not say."""

from __future__ import annotations

import time


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)


def render_table(rails: list[dict]) -> str:
    head = ("HOST", "RAIL", "IFACE", "STATE", "ADDRESS", "BW", "RTT", "SENT", "RECV", "RESENT", "FAILOVERS",
            "LAST ERROR")
    rows = [head]
    for r in rails:
        rows.append((r["host"], str(r["rail"]), r["interface"] + (" (fallback)" if r["fallback"] else ""),
                     r["state"], r["address"], _fmt_bytes(r["bandwidth_Bps"]) + "/s", f"{r['rtt_s'] * 1e3:.2f}ms",
                     _fmt_bytes(r["bytes_sent"]), _fmt_bytes(r["bytes_received"]), str(r["chunks_resent"]),
                     str(r["failovers"]), (r["last_error"] or "-")[:60]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def render_decisions(rails: list[dict]) -> str:
    """One line per operator decision in force: host, rail, what, who, when, why."""
    from r2cc_serve.health.decisions import describe

    lines = [f"  {r['host']} {describe(r['rail'], d['action'], d)}" for r in rails for d in r.get("decisions", ())]
    return "operator decisions:\n" + "\n".join(lines) if lines else ""


def render_holds(rails: list[dict]) -> str:
    """One line per rail held out (flapping or lossy): host, rail, time left, what it did, why."""
    def what(h: dict) -> str:
        return "losing packets" if h["reason"].startswith("lossy") else f"{h['failures']} failures"
    lines = [f"  {r['host']} rail{r['rail']}: held {r['hold']['left_s']:.0f} s more after {what(r['hold'])} "
             f"({r['hold']['reason']}); `r2cc rails restore {r['host']}:{r['rail']}` ends it"
             for r in rails if r.get("hold")]
    return "rails held out:\n" + "\n".join(lines) if lines else ""


def render_stale(rails: list[dict], now: float) -> str:
    """One line per host whose numbers are a late rank's last answer: its counters stand still
    because nobody has heard from it lately, not because its rails stopped."""
    ages = {r["host"]: now - r["sampled_at"] if r.get("sampled_at") else None for r in rails if r.get("stale")}
    lines = [f"  {host}: a rank missed the last poll; its numbers are from "
             + ("an earlier answer" if age is None else f"{max(age, 0.0):.1f} s ago") for host, age in ages.items()]
    return "stale:\n" + "\n".join(lines) if lines else ""


def render_plans(groups: list[dict]) -> str:
    """One line per group: its schedule, each rank's agreed bandwidth, the latest decisions."""
    lines = []
    for g in groups:
        line = f"plan {g['group']}: {g['schedule']}"
        if g["epoch"] is not None:
            bws = "/".join("-" if r["bandwidth_Bps"] is None else _fmt_bytes(r["bandwidth_Bps"]) for r in g["ranks"])
            line += f", table {g['epoch']}{'' if g['agreed'] else ' (ranks not yet agreed)'}: {bws} per s"
        picks = [f"{_fmt_bytes(c['size_bucket_bytes'])}->{c['schedule']}" + (f"/K{c['chunks']}" if c["chunks"] > 1 else "")
                 for c in g["choices"][-4:]]
        if picks:
            line += "; chose " + ", ".join(picks)
        lines.append(line)
    return "\n".join(lines)


def print_notes(rails: list[dict]) -> None:
    """What the table's columns do not say: decisions in force, holds, late answers."""
    for extra in (render_decisions(rails), render_holds(rails), render_stale(rails, time.time())):
        if extra:
            print("\n" + extra)
