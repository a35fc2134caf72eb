"""`r2cc lab up|down|status|fault`: drive the fault lab from the shell.

Errors the user can fix (bad input, not root, missing tools, no lab) are raised as UserError
(LabError is one), which the main CLI prints as one line with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time

from r2cc_serve import envs
from r2cc_serve.errors import UserError
from r2cc_testbed.faults.model import FLAP_DEFAULTS, LAB_KINDS, parse_fault_words, parse_timed
from r2cc_testbed.faults.timing import looks_like_notation
from r2cc_testbed.lab.lab import Lab
from r2cc_testbed.lab.layout import check_counts
from r2cc_serve.util.rates import check_rate


def register(subparsers) -> None:
    lab = subparsers.add_parser("lab", help="network-namespace fault lab (hosts, rails, faults)",
                                description="Servers are network namespaces, rails are veth interfaces.")
    sub = lab.add_subparsers(dest="lab_command", metavar="LAB_COMMAND")
    lab.set_defaults(func=lambda _args: _print_help(lab))

    up = sub.add_parser("up", help="build the lab (tears down an existing one first)")
    up.add_argument("--hosts", type=int, default=2, help="number of hosts (namespaces), >= 2")
    up.add_argument("--rails", type=int, default=4, help="rails per host, >= 1")
    up.add_argument("--rate", help="shape every rail, both directions, e.g. 100mbit or 1gbit")
    up.add_argument("--mtu", type=int, default=1500, help="rail MTU (65535 for unshaped bandwidth tests)")
    up.set_defaults(func=_up)

    down = sub.add_parser("down", help="remove every namespace, interface and rule of the lab")
    down.set_defaults(func=_down)

    st = sub.add_parser("status", help="print the lab's live state as JSON")
    st.set_defaults(func=_status)

    fault = sub.add_parser(
        "fault", help="inject or undo a fault on one host's rail",
        usage="r2cc lab fault FAULT | HOST RAIL KIND [ARGS ...]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="FAULT is the fault notation (docs/faults.md), h<HOST>:<RAIL>:<KIND>[:ARGS][@SECONDS][+SECONDS]:\n"
                    "  r2cc lab fault h0:1:degrade:100mbit      now, until undone (h0:1:clear)\n"
                    "  r2cc lab fault h0:1:lossy:5%@3s+10s      in 3 s, for 10 s, then undone\n"
                    "or the same as words: r2cc lab fault h0 1 degrade 100mbit\n"
                    "kinds:\n  down | up | blackhole | clear\n  degrade RATE        e.g. degrade 100mbit\n"
                    "  lossy PCT           drop PCT% of the rail's packets each way, e.g. lossy 1\n"
                    "  gray [DIR] [BYTES]  drop every IP packet longer than BYTES (default 1000), e.g. gray out 600\n"
                    "  marginal PCT [DIR]  drop PCT% of the IP packets longer than 1000 bytes, e.g. marginal 90\n"
                    "  flap [PERIOD_MS COUNT]  e.g. flap 200 5 (down/up COUNT times; default {} {})\n"
                    "DIR: both (default), out (what HOST sends on the rail) or in (what arrives at HOST)"
                    .format(*FLAP_DEFAULTS))
    fault.add_argument("words", metavar="FAULT", nargs="+",
                       help="h0:1:degrade:100mbit[@SECONDS][+SECONDS], or HOST RAIL KIND [ARGS]: host 0, h0 or "
                            "<prefix>-h0; rail 0 or rail0; KIND one of " + " | ".join(LAB_KINDS) +
                            "; ARGS: RATE for degrade, PCT for lossy, [DIR] [BYTES] for gray, PCT [DIR] for "
                            "marginal, PERIOD_MS COUNT for flap")
    fault.set_defaults(func=_fault)

    from r2cc_testbed.guest.cli import register as register_guest  # `r2cc lab guest ...`
    register_guest(sub)


def _print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _up(args) -> int:
    check_counts(args.hosts, args.rails, args.mtu)  # fail on bad input before needing root
    rate = check_rate(args.rate) if args.rate else None
    lab = Lab.up(hosts=args.hosts, rails=args.rails, rate=rate, mtu=args.mtu)
    shape = f"rate {lab.rate} each way" if lab.rate else "unshaped"
    kind = f"bridges in {lab.switch_ns}" if lab.switch_ns else "direct veth pairs"
    print(f"lab up: {lab.hosts} hosts ({lab.host_ns(0)}..{lab.host_ns(lab.hosts - 1)}) x "
          f"{lab.rails} rails ({kind}), {shape}, mtu {lab.mtu}")
    shown = ", ".join(f"{lab.rail_ifname(k)} {lab.rail_subnet(k)}" for k in range(min(lab.rails, 8)))
    print(f"  rails: {shown}{' ...' if lab.rails > 8 else ''} (host i is .i+1)")
    print(f"  mgmt: {lab.mgmt_ifname} {lab.mgmt_ip(0)}..{lab.mgmt_ip(lab.hosts - 1)}, "
          f"root namespace {lab.mgmt_root_ip} on bridge {lab.mgmt_bridge}")
    if lab.rails > 1:
        print("  mptcp: a subflow endpoint per rail beyond rail0 in every host (used only by MPTCP sockets, "
              "e.g. the gloo-mptcp baseline)" if lab.mptcp else "  mptcp: not available in this kernel")
    return 0


def _down(args) -> int:
    removed = Lab.down()
    print(f"lab down: removed {len(removed)} namespace(s)/link(s)" if removed
          else "lab down: nothing to remove")
    return 0


def _status(args) -> int:
    json.dump(Lab.load().status(), sys.stdout, indent=2)
    print()
    return 0


def _fault(args) -> int:
    if len(args.words) == 1 and looks_like_notation(args.words[0]):
        spec = parse_timed(args.words[0], LAB_KINDS).spec
    elif len(args.words) >= 3:
        host, rail, kind, *rest = args.words
        spec = parse_fault_words([kind, *rest], parse_host(host), parse_rail(rail), LAB_KINDS)
    else:
        raise UserError(f"{' '.join(args.words)!r} is not a fault: give h<HOST>:<RAIL>:<KIND>[:ARGS][@SECONDS]"
                        "[+SECONDS] (e.g. h0:1:degrade:100mbit) or HOST RAIL KIND [ARGS] (e.g. h0 1 down)")
    spec.check_hold()
    lab = Lab.load()
    progress = (lambda msg: print(msg, file=sys.stderr, flush=True))
    undo = spec.undo(lab.rails) if spec.hold_s is not None else []
    if spec.after_s:
        progress(f"{spec.action} on {spec.target} in {spec.after_s:g} s")
        time.sleep(spec.after_s)
    lab.inject(spec, progress=progress)
    print(f"{lab.host_ns(spec.host)} {lab.rail_ifname(spec.rail)}: {spec.action}", flush=True)
    if undo:
        try:
            _wait_showing(spec.hold_s, f"{spec.action} on {spec.target}", progress)
        finally:  # Ctrl-C too: nothing is left broken
            for u in undo:
                lab.inject(u, progress=progress)
            print(f"{lab.host_ns(spec.host)} {lab.rail_ifname(spec.rail)}: undone ({undo[0].kind}) after "
                  f"{spec.hold_s:g} s", flush=True)
    return 0


def _wait_showing(seconds: float, what: str, progress) -> None:
    """Sleep, saying every 5 s how long is left."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        progress(f"{what}: {left:.1f} s left")
        time.sleep(min(5.0, left))


def parse_host(text: str) -> int:
    """Host index from '0', 'h0' or '<prefix>-h0'."""
    prefix = re.escape(envs.get("R2CC_LAB_PREFIX"))
    match = re.fullmatch(rf"(?:(?:{prefix}-)?h)?(\d+)", text.strip())
    if not match:
        raise UserError(f"HOST {text!r} is not a host: use an index like 0, h0 or "
                        f"{envs.get('R2CC_LAB_PREFIX')}-h0")
    return int(match.group(1))


def parse_rail(text: str) -> int:
    match = re.fullmatch(r"(?:rail)?(\d+)", text.strip())
    if not match:
        raise UserError(f"RAIL {text!r} is not a rail: use an index like 0 or rail0")
    return int(match.group(1))
