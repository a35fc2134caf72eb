"""`r2cc admin` (standalone admin API) and `r2cc rails` (its view as a terminal table, and its actions)."""

from __future__ import annotations

import json
import os
import time

from r2cc_serve import envs
from r2cc_serve.admin.actions import ACTIONS, FORCEABLE, TARGET_HELP, parse_rail_target, resolve
from r2cc_serve.admin.client import (ADMIN_TOKEN_HINT, DEFAULT_PORT, add_api_options, admin_token, connect,
                                    read_token)
from r2cc_serve.admin.render import print_notes, render_plans, render_table
from r2cc_serve.errors import UserError


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


def _rails(args) -> int:
    with connect(args.url, read_token(args.token)) as api:
        while True:
            rails = api.get("/rails", "rails")["rails"]
            health = api.get("/health", "status")
            plans = api.get("/plan", "groups")["groups"]
            if args.json:
                print(json.dumps({"rails": rails, "health": health, "plan": plans}, indent=2))
            else:
                if args.watch:
                    print("\x1b[2J\x1b[H", end="")
                print(render_table(rails))
                print_notes(rails)
                if plans:
                    print("\n" + render_plans(plans))
                print(f"\nhealth: {health['status']}" + "".join(f"\n  - {r}" for r in health["reasons"]))
            if not args.watch:
                return 0 if health["status"] != "down" else 1
            time.sleep(args.watch)


def _act(args) -> int:
    """`r2cc rails ACTION HOST:RAIL`: resolve the rail in the API's view, act, show it after."""
    import httpx

    from r2cc_serve.health.decisions import REASON_MAX_CHARS, check_text

    action = args.action
    if args.json or args.watch:
        raise UserError(f"--json and --watch go with the table (`r2cc rails`), not with {action}")
    target = parse_rail_target(args.target)
    try:
        reason = check_text(args.reason, REASON_MAX_CHARS, "--reason")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    with connect(args.url, admin_token(args.token, f"r2cc rails {action}")) as api:
        host = resolve(target, api.get("/rails", "rails", ADMIN_TOKEN_HINT)["rails"])
        done = api.act(action, host, target.rail, force=getattr(args, "force", False), reason=reason)
        ranks = f"rank{'s' if len(done['ranks']) > 1 else ''} {', '.join(map(str, done['ranks']))}"
        print(f"{action} {host} rail{target.rail} ({target.text}): done on {ranks}; state now {done['state']}")
        for warning in done.get("warnings") or ():
            print(f"warning: {warning}")
        try:  # the row as the view shows it now, with the decision and its reason
            rails = api.get("/rails", "rails")["rails"]
        except (UserError, httpx.HTTPError):
            return 0  # done all the same, as the line above says
        rail = [r for r in rails if (r["host"], r["rail"]) == (host, target.rail)]
        if rail:
            print("\n" + render_table(rail))
            print_notes(rail)
    return 0


def register_actions(rails_parser) -> None:
    """`r2cc rails drain|undrain|failover|restore HOST:RAIL`: the API's actions, one each."""
    import argparse

    actions = rails_parser.add_subparsers(dest="action", metavar="ACTION", required=False,
                                          title="actions on one rail (without one, `r2cc rails` shows the table)")
    for action, summary in ACTIONS.items():
        p = actions.add_parser(action, help=summary, description=f"{summary}. The rail: {TARGET_HELP}.")
        p.add_argument("target", metavar="HOST:RAIL", help=TARGET_HELP)
        p.add_argument("--reason", help="why (plain text, one line): in the audit trail, and kept with "
                                        "the rail while a drain or failover holds")
        if action in FORCEABLE:
            p.add_argument("--force", action="store_true", help=f"{action} even the last healthy rail of the host")
        add_api_options(p, token_help="the admin token (default: R2CC_ADMIN_TOKEN, or the file "
                                      "R2CC_ADMIN_TOKEN_FILE names)", default=argparse.SUPPRESS)
        p.set_defaults(func=_act)


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
    p = sub.add_parser("rails", help="show every rail of every host, or drain, undrain, fail over or restore one "
                                     "(a client of the admin API)",
                       description="Without an ACTION: every rail of every host, as a table. With one: that "
                                   "action on one rail, e.g. `r2cc rails drain h1:2 --reason 'swap cable'` "
                                   "(h1: the second host the table lists) or `r2cc rails undrain node0:2`.")
    add_api_options(p, token_help="bearer token for reads (default: R2CC_ADMIN_READ_TOKEN, else R2CC_ADMIN_TOKEN); "
                                  "needed when the API closes reads, e.g. vLLM's --api-key")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--watch", type=float, metavar="SECONDS", help="refresh every SECONDS until Ctrl-C")
    p.set_defaults(func=_rails)
    register_actions(p)
    return tools
