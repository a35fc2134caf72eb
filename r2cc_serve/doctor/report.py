"""How a doctor run is shown: a table of rail pairs, a table of kernel settings, then one line
per problem with its fix, and the exit code (0 every check ok, 1 any problem)."""

from __future__ import annotations

from r2cc_serve.doctor.checks import Report

PAIR_COLUMNS = ("rail", "here", "peer", "port", "path", "mtu", "Mbit/s out / in")
MAX_PEER_COLUMNS = 3  # more peers than this share one settings column


def table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def render(report: Report) -> str:
    lines = [f"r2cc doctor on {report.host}: {len(report.rails)} rail(s) x {len(report.peers)} peer(s), "
             f"port {report.port} ({report.seconds:.1f} s)", ""]
    rows = [list(PAIR_COLUMNS)]
    for res in report.pairs:
        f, c = res.facts, res.cells
        rows.append([str(f.rail.index), f"{f.rail.ifname} {f.rail.addr or '-'}", f.dst, c.get("port", "-"),
                     c.get("path", "-"), c.get("mtu", "-"), c.get("bandwidth", "-")])
    lines += table(rows) + [""] + _settings_table(report) + [""]
    if report.problems:
        lines.append(f"problems ({len(report.problems)}), each with its fix:")
        lines += [f"  {p.line()}" for p in report.problems]
        lines.append(f"r2cc doctor: {len(report.problems)} problem(s) (exit 1)")
    else:
        lines.append("r2cc doctor: every check ok (exit 0)")
    return "\n".join(lines)


def _settings_table(report: Report) -> list[str]:
    hosts = list(report.settings)
    peers = hosts[1:]
    collapse = len(peers) > MAX_PEER_COLUMNS
    head = ["setting", "here"] + (["peers"] if collapse else [f"peer {h}" for h in peers]) + ["verdict"]
    rows = [head]
    for n, here in enumerate(report.settings["here"]):
        theirs = [report.settings[h][n] for h in peers if n < len(report.settings[h])]
        values = [s.value for s in theirs]
        if collapse:
            values = [values[0] if len(set(values)) == 1 else "varies"] if values else []
        verdicts = {s.verdict for s in [here, *theirs]}
        verdict = "PROBLEM" if "problem" in verdicts else "ok" if "ok" in verdicts else "info"
        rows.append([here.name, here.value, *values, verdict])
    return table(rows)


def as_json(report: Report) -> dict:
    return {"host": report.host, "port": report.port, "seconds": round(report.seconds, 3),
            "exit": report.exit_code,
            "pairs": [{"rail": res.facts.rail.index, "ifname": res.facts.rail.ifname, "addr": res.facts.rail.addr,
                       "peer": res.peer.label, "dst": res.facts.dst, **res.cells,
                       "mbit_out": res.facts.mbit_out, "mbit_in": res.facts.mbit_in} for res in report.pairs],
            "settings": {host: [{"name": s.name, "value": s.value, "verdict": s.verdict} for s in rows]
                         for host, rows in report.settings.items()},
            "problems": [p.line() for p in report.problems]}
