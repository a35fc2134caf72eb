"""`r2cc admin` (standalone admin API) and `r2cc rails` (its view as a terminal table)."""

from __future__ import annotations

import json
import os
import time

from r2cc_serve import envs
from r2cc_serve.errors import UserError

DEFAULT_PORT = 8470
VLLM_DEFAULT_PORT = 8000  # `vllm serve --port`'s default


def _serve(args) -> int:
    import uvicorn

    from r2cc_serve.admin.app import create_app
    from r2cc_serve.admin.auth import configured_read_token, configured_token
    from r2cc_serve.admin.sources import StatusDirSource

    status_dir = args.status_dir or envs.get("R2CC_STATUS_DIR")
    if not os.path.isdir(status_dir):
        raise UserError(f"status directory {status_dir} does not exist: start an r2cc group on this host first, "
                        "or pass --status-dir (R2CC_STATUS_DIR of that group; in a systemd unit with "
                        "RuntimeDirectory=NAME it is /run/NAME/r2cc-status)")
    token = configured_token()
    if token is None:
        print("r2cc admin: no R2CC_ADMIN_TOKEN set: reads work, drain/failover answer 403", flush=True)
    if not _is_loopback(args.host) and not configured_read_token():
        print(f"r2cc admin: warning: listening on {args.host}, not only on this machine: anyone who reaches it "
              "can read rail state and the audit trail (set R2CC_ADMIN_READ_TOKEN to close reads; mutations "
              "still need the token)", flush=True)
    app = create_app(StatusDirSource(status_dir), token)
    print(f"r2cc admin: http://{args.host}:{args.port}/r2cc/v1/rails (agents from {status_dir})", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: assume it is reachable from elsewhere


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
             f"({r['hold']['reason']}); POST /r2cc/v1/rails/{r['host']}/{r['rail']}/restore ends it" for r in rails if r.get("hold")]
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


def _get_doc(client, url: str, key: str) -> dict:
    """GET url and return its JSON document, which must have `key`; UserError otherwise."""
    r = client.get(url)
    try:
        doc = r.json()
    except ValueError:
        doc = None
    # /health answers 503 with a normal body when the group is down.
    if r.status_code == 401:
        raise UserError(f"GET {url} answered 401: this admin API needs a token for reads; set R2CC_ADMIN_READ_TOKEN "
                        "(or R2CC_ADMIN_TOKEN) here to the one it takes, or vLLM's API key with --token")
    if not isinstance(doc, dict) or key not in doc or r.status_code not in (200, 503):
        raise UserError(f"GET {url} answered HTTP {r.status_code} without an r2cc {key!r} document "
                        f"({r.text[:120]!r}); is this an r2cc admin API (`r2cc admin`, or vLLM started with "
                        "--distributed-backend r2cc)?")
    return doc


# Where `r2cc rails` looks without --url: `r2cc admin` on this host, then vLLM's default port.
LOCAL_CANDIDATES = (f"http://127.0.0.1:{DEFAULT_PORT}", f"http://127.0.0.1:{VLLM_DEFAULT_PORT}")


def find_local_api(client, candidates=LOCAL_CANDIDATES) -> str:
    """The first candidate base URL whose /r2cc/v1/health answers as r2cc's (401 counts: it is
    there, and the read that follows names the token); UserError naming what was tried."""
    import httpx

    for base in candidates:
        try:
            r = client.get(base + "/r2cc/v1/health", timeout=1.0)
        except httpx.HTTPError:
            continue
        if r.status_code == 401 or (r.status_code in (200, 503) and "status" in _json_or_empty(r)):
            return base
    raise UserError(f"no r2cc admin API answers on this host at {' or '.join(candidates)} (`r2cc admin`, or "
                    "vLLM's default port): give the API server's address, e.g. `r2cc rails --url "
                    "http://127.0.0.1:PORT` with vLLM's --port")


def _json_or_empty(r) -> dict:
    try:
        doc = r.json()
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _rails(args) -> int:
    import httpx

    # One kept-alive client: httpx.get() builds a new client (and TLS context) per call, ~80 ms of CPU here.
    from r2cc_serve.admin.auth import configured_read_token, configured_token

    token = args.token or configured_read_token() or configured_token()
    client = httpx.Client(timeout=5, trust_env=False, headers={"Authorization": f"Bearer {token}"} if token else None)
    if not args.url:
        try:
            args.url = find_local_api(client)
        except UserError:
            client.close()
            raise
    url = args.url.rstrip("/") + "/r2cc/v1"
    try:
        while True:
            rails = _get_doc(client, url + "/rails", "rails")["rails"]
            health = _get_doc(client, url + "/health", "status")
            plans = _get_doc(client, url + "/plan", "groups")["groups"]
            if args.json:
                print(json.dumps({"rails": rails, "health": health, "plan": plans}, indent=2))
            else:
                if args.watch:
                    print("\x1b[2J\x1b[H", end="")
                print(render_table(rails))
                for extra in (render_decisions(rails), render_holds(rails), render_stale(rails, time.time())):
                    if extra:
                        print("\n" + extra)
                if plans:
                    print("\n" + render_plans(plans))
                print(f"\nhealth: {health['status']}" + "".join(f"\n  - {r}" for r in health["reasons"]))
            if not args.watch:
                return 0 if health["status"] != "down" else 1
            time.sleep(args.watch)
    except httpx.HTTPError as exc:
        raise UserError(f"cannot reach the admin API at {args.url} ({type(exc).__name__}); is `r2cc admin` or "
                        "vLLM with --distributed-backend r2cc running there?") from None
    finally:
        client.close()


def register(sub):
    """Add `r2cc admin` and `r2cc rails`; returns the subparsers of `r2cc admin`'s tools."""
    p = sub.add_parser("admin", help="serve the admin REST API for the r2cc groups on this host")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: local only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--status-dir", help="R2CC_STATUS_DIR of the group (default: this process's)")
    p.set_defaults(func=_serve)
    # Tools under `r2cc admin` that are not part of the API (probe-latency, from the test bed)
    # are added by the top-level CLI: the runtime does not import the test bed.
    tools = p.add_subparsers(dest="admin_command", metavar="TOOL", required=False,
                             title="tools (without one, `r2cc admin` serves the API)")
    p = sub.add_parser("rails", help="show every rail of every host (a client of the admin API)")
    p.add_argument("--url", help="admin API base URL: vLLM's own server (its --port, e.g. http://10.0.0.1:8000) or "
                                 f"`r2cc admin`'s; default: whichever answers on this host at {DEFAULT_PORT} "
                                 f"(r2cc admin) or {VLLM_DEFAULT_PORT} (vLLM's default port)")
    p.add_argument("--token", help="bearer token for reads (default: R2CC_ADMIN_READ_TOKEN, else R2CC_ADMIN_TOKEN); "
                                   "needed when the API closes reads, e.g. vLLM's --api-key")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--watch", type=float, metavar="SECONDS", help="refresh every SECONDS until Ctrl-C")
    p.set_defaults(func=_rails)
    return tools
