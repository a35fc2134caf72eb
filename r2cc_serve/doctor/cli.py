"""`r2cc doctor`: check a deployment's rails before it serves.

    r2cc doctor --serve --rails eth1,eth2,eth3,eth4                 # on every node: the responder
    r2cc doctor --rails eth1,eth2,eth3,eth4 --peer 10.0.1.2,10.0.2.2,10.0.3.2,10.0.4.2
    r2cc doctor --config configs/rails-node.yaml --peers peers.txt  # the communicator's rail map
    r2cc doctor --lab                                               # every host of the fault lab
    r2cc doctor --rdma --rails rxe0:1,rxe1:1                        # RDMA ports: state, MTU, GIDs

Exit 0: every check ok; 1: a problem (each printed on one line with its fix); 2: bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import socket

from r2cc_serve import envs
from r2cc_serve.comm.rail_config import load_rail_config
from r2cc_serve.doctor import checks, netinfo, report, responder
from r2cc_serve.doctor.rails import read_peers_file, parse_peer, resolve_rails
from r2cc_serve.doctor.wire import DEFAULT_PORT
from r2cc_serve.errors import UserError

DEFAULT_BANDWIDTH_S = 0.2
MAX_BANDWIDTH_S = 5.0


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "doctor", help="check every rail pair before serving (path, MTU, ports, bandwidth, kernel settings)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--serve", action="store_true",
                      help="answer other nodes' checks on every rail until Ctrl-C (run it on each node)")
    mode.add_argument("--lab", action="store_true",
                      help="the fault lab: a responder in every lab host, then the checks from each")
    mode.add_argument("--rdma", action="store_true",
                      help="list this host's RDMA ports (state, MTU, IPv4 GIDs) and check the RDMA rails "
                           "--rails names (device:port)")
    p.add_argument("--rails", help="this host's rails in rail order: interface names or IPv4 addresses "
                                   "(default: R2CC_RAILS, or the rails of --config / R2CC_CONFIG)")
    p.add_argument("--config", metavar="FILE", help="the communicator's rail map (YAML, as R2CC_CONFIG takes)")
    p.add_argument("--rank", type=int, default=0,
                   help="the rank whose namespace a rail map's netns template names ({rank}, {node}); default 0")
    p.add_argument("--peer", action="append", default=[], metavar="ADDR,ADDR,...",
                   help="a peer's rail addresses in rail order (repeat for more peers)")
    p.add_argument("--peers", metavar="FILE", help="peers, one a line: [NAME] ADDR,ADDR,...")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"the responder's port, tcp and udp (default {DEFAULT_PORT})")
    p.add_argument("--bandwidth-seconds", type=float, default=DEFAULT_BANDWIDTH_S, metavar="S",
                   help=f"length of each bandwidth probe, each way (default {DEFAULT_BANDWIDTH_S}; 0 skips it)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_run, lab_func=None)
    return p


def _run(args) -> int:
    _check_numbers(args)
    if args.lab:
        if args.rails or args.config or args.peer or args.peers:
            raise UserError("--lab takes the lab's own rails and hosts: leave out --rails, --config, --peer, --peers")
        if args.lab_func is None:
            raise UserError("--lab belongs to the test bed: run it as `r2cc doctor --lab` where r2cc_testbed "
                            "is installed")
        return args.lab_func(args)
    if args.rdma:
        from r2cc_serve.doctor import rdma

        return rdma.run([x.strip() for x in (args.rails or "").split(",") if x.strip()], args.json)
    specs, netns = _rail_specs(args)
    if netns:
        netinfo.enter_netns(netns)  # before any thread starts: they inherit it
    ifaces = netinfo.interfaces()
    if args.serve:
        if args.peer or args.peers:
            raise UserError("--serve answers checks; name peers only where you run the checks")
        return _serve(specs, ifaces, args.port)
    rails = resolve_rails(specs, ifaces)
    peers = [parse_peer(text, len(rails)) for text in args.peer]
    if args.peers:
        peers += read_peers_file(args.peers, len(rails))
    if not peers:
        raise UserError("name the peers: --peer ADDR,ADDR,... (a peer's rail addresses in rail order) "
                        "or --peers FILE; start `r2cc doctor --serve` on each of them first")
    host = socket.gethostname() + (f" (netns {ns})" if (ns := netns or netinfo.netns_name()) else "")
    result = checks.run(host, rails, peers, args.port, args.bandwidth_seconds)
    print(json.dumps(report.as_json(result), indent=2) if args.json else report.render(result), flush=True)
    return result.exit_code


def _check_numbers(args) -> None:
    if not 1 <= args.port <= 65535:
        raise UserError(f"--port {args.port}: use 1-65535")
    if not 0 <= args.bandwidth_seconds <= MAX_BANDWIDTH_S:
        raise UserError(f"--bandwidth-seconds {args.bandwidth_seconds:g}: use 0 (skip) to {MAX_BANDWIDTH_S:g}")


def _rail_specs(args) -> tuple[list[str] | None, str | None]:
    """This host's rails and their namespace, read as the communicator reads them; None for a
    responder given no rails (it then listens on every address)."""
    if args.rails:
        specs = [x.strip() for x in args.rails.split(",") if x.strip()]
        if not specs:
            raise UserError("--rails names no rail: give interface names or IPv4 addresses, e.g. eth1,eth2")
        return specs, None
    if args.config:
        if not os.path.isfile(args.config):
            raise UserError(f"--config {args.config}: no such file")
        os.environ["R2CC_CONFIG"] = args.config  # then read exactly as the communicator reads it
    if not (envs.get("R2CC_RAILS") or envs.get("R2CC_CONFIG")):
        if args.serve:
            return None, None
        raise UserError("name this host's rails: --rails eth1,eth2,... or --config FILE (a rail map such as "
                        "configs/rails-node.yaml), or set R2CC_RAILS / R2CC_CONFIG")
    cfg = load_rail_config(args.rank, args.rank)
    return cfg.rails, cfg.netns


def _serve(specs: list[str] | None, ifaces: dict, port: int) -> int:
    if specs is None:
        return responder.serve(["0.0.0.0"], port, ["every address"])
    rails = resolve_rails(specs, ifaces)
    missing = [r for r in rails if r.addr is None]
    if missing:
        raise UserError(f"rail {missing[0].index} ({missing[0].ifname}) has no IPv4 address to listen on: "
                        f"`ip addr add ADDRESS/PREFIX dev {missing[0].ifname}`")
    return responder.serve([r.addr for r in rails], port, [r.ifname for r in rails])
