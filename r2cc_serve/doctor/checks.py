"""The checks of `r2cc doctor`: rail k of this host against rail k of every peer, both ways.

run() gathers facts (probes.py, netinfo.py) and the judge_* functions turn them into table
cells and problems, each with its fix. Judging is kept apart from probing so it can be tested
without a network. A problem whose cause explains others is reported alone: a rail whose link
is down here is not probed, a peer that answers on no rail is one line, not one per rail.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from r2cc_serve.doctor import netinfo, settings
from r2cc_serve.doctor.netinfo import Iface
from r2cc_serve.doctor.probes import Control, ProbeError, Reply, Udp, largest_passing
from r2cc_serve.doctor.rails import Peer, Rail

SLOW_FRACTION = 0.5   # a rail under half its siblings' median bandwidth is flagged


@dataclass(frozen=True)
class Timeouts:
    connect_s: float = 1.5   # a TCP connect or a control answer
    path_s: float = 1.0      # a path probe (sent twice within it)
    mtu_round_s: float = 0.3  # one round of the MTU search


TIMEOUTS = Timeouts()


@dataclass(frozen=True)
class Problem:
    where: str
    what: str
    fix: str

    def line(self) -> str:
        return f"{self.where}: {self.what}; fix: {self.fix}"


@dataclass
class PairFacts:
    """What the probes of one rail pair found. tcp is "ok" or a ProbeError kind."""
    rail: Rail
    dst: str
    port: int
    tcp: str = "ok"
    tcp_detail: str = ""
    hello: dict | None = None
    route_dev: str | None = None          # our route to dst from the rail's address
    routed: Reply | None = None           # the reply to a probe sent as r2cc sends
    routed_here: str | None = None        # our interface it arrived by
    routed_error: str | None = None
    pinned: Reply | None = None           # the reply to a probe pinned to the rail's interface
    pinned_error: str | None = None
    arp: str | None = None                # neighbour state of dst on the rail's interface
    out_largest: int | None = None        # set when a full-size datagram did not cross
    back_largest: int | None = None
    mbit_out: float | None = None
    mbit_in: float | None = None
    bandwidth_error: str | None = None
    data_port_shut: bool = False          # the control port answered, the ephemeral data port did not

    @property
    def answered(self) -> bool:
        return self.tcp == "ok" or self.routed is not None or self.pinned is not None

    @property
    def peer_if(self) -> str | None:
        """The peer's interface holding dst."""
        for reply in (self.routed, self.pinned):
            if reply and reply.fields.get("holder"):
                return reply.fields["holder"]
        rails = (self.hello or {}).get("rails") or []
        return rails[self.rail.index] if self.rail.index < len(rails) else None

    @property
    def peer_mtu(self) -> int | None:
        for reply in (self.pinned, self.routed):
            if reply and reply.fields.get("holder_mtu"):
                return reply.fields["holder_mtu"]
        return None


@dataclass
class PairResult:
    peer: Peer
    facts: PairFacts
    cells: dict = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)


@dataclass
class Report:
    host: str
    port: int
    rails: list[Rail]
    peers: list[Peer]
    pairs: list[PairResult] = field(default_factory=list)
    settings: dict[str, list[settings.Setting]] = field(default_factory=dict)  # by host label
    problems: list[Problem] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        return 1 if self.problems else 0


# --- judging (pure) ---------------------------------------------------------------------------

def _pair_where(f: PairFacts) -> str:
    return f"rail {f.rail.index} -> {f.dst}"


def _route_fix(f: PairFacts) -> str:
    """Make the kernel send rail k's packets by rail k's NIC."""
    me, dev, table = f.rail.addr, f.rail.ifname, 100 + f.rail.index
    return (f"`ip route get {f.dst} from {me}` must say dev {dev}: remove the route that says otherwise, or give "
            f"the rail its own table: `ip rule add from {me} table {table}; "
            f"ip route add {f.rail.network} dev {dev} src {me} table {table}`")


ARP_FIX = "sysctl -w net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2"


def judge_silent(f: PairFacts) -> Problem:
    """Nothing answered on this pair (no TCP, no UDP): say why as precisely as the kernel lets us."""
    where, me, dev, k = _pair_where(f), f.rail.addr, f.rail.ifname, f.rail.index
    if "refused" in (f.tcp, f.routed_error):
        return Problem(where, f"nothing listens on {f.dst}:{f.port} (connection refused)",
                       f"start `r2cc doctor --serve` on the peer, with {f.dst} among its rails")
    if f.tcp == "blocked":
        return Problem(where, f"this host's firewall stops packets to {f.dst}:{f.port} (EPERM)",
                       f"allow tcp and udp {f.port} out of {dev} here")
    if f.tcp == "unreachable" and f.arp not in netinfo.RESOLVED:
        return Problem(where, f"{f.dst} is unreachable from {me} ({f.tcp_detail.rsplit(': ', 1)[-1]})",
                       f"check that {f.dst} is the peer's rail-{k} address (--peer lists them in rail order) "
                       f"and in {dev}'s subnet: `ip route get {f.dst} from {me}`")
    if f.arp in netinfo.RESOLVED:
        return Problem(where, f"{f.dst} answers ARP on {dev} but port {f.port} times out (tcp and udp): "
                              "a firewall drops it",
                       f"allow tcp and udp {f.port} to {f.dst} in the peer's firewall (e.g. `nft insert rule inet "
                       f"filter input ip daddr {f.dst} tcp dport {f.port} accept`), and the ephemeral ports r2cc "
                       "listens on (its net.ipv4.ip_local_port_range)")
    return Problem(where, f"no answer from {f.dst} on {dev}, not even to ARP: the link is down on the way "
                          f"or {f.dst} is not the peer's rail-{k} address",
                   f"check the peer's NIC holding {f.dst} (`ip link`, `ip addr` there), the cable and the switch "
                   f"port; `ip neigh show {f.dst} dev {dev}` here")


def judge_path(f: PairFacts) -> list[Problem]:
    """Did rail k's packets leave by rail k's NIC and arrive at the peer's rail-k NIC, and the
    replies come back the same way?"""
    where, me, dev = _pair_where(f), f.rail.addr, f.rail.ifname
    peer_if = f.peer_if
    out = []
    if f.routed is None:
        via = f" (the kernel sends them by {f.route_dev})" if f.route_dev and f.route_dev != dev else ""
        return [Problem(where, f"probes from {me} routed as r2cc sends get no answer ({f.routed_error}) while "
                               f"probes pinned to {dev} do{via}", _route_fix(f))]
    there = f.routed.fields.get("arrived")
    if peer_if and there != peer_if:
        if f.route_dev and f.route_dev != dev:
            out.append(Problem(where, f"packets from {me} leave by {f.route_dev}, not {dev}, and reach the peer "
                                      f"by its {there}: a fault on {dev} would go unseen", _route_fix(f)))
        else:
            out.append(Problem(where, f"packets to {f.dst} reach the peer by its {there}, not {peer_if}: "
                                      f"the peer answers ARP for {f.dst} on another NIC",
                               f"on the peer: {ARP_FIX}, and a routing table per rail"))
    if f.routed_here and f.routed_here != dev:
        back = (f.hello or {}).get("route_dev")
        if back and peer_if and back != peer_if:
            out.append(Problem(where, f"the peer sends to {me} by its {back}, not {peer_if}: replies arrive here "
                                      f"by {f.routed_here}",
                               f"on the peer, `ip route get {me} from {f.dst}` must say dev {peer_if}: remove the "
                               "route that says otherwise, or give that rail its own routing table"))
        else:
            out.append(Problem(where, f"the peer's replies arrive here by {f.routed_here}, not {dev}: this host "
                                      f"answers ARP for {me} on another NIC",
                               f"here: {ARP_FIX}, and a routing table per rail"))
    if not out and f.pinned is None and f.pinned_error not in (None, "unsupported"):
        out.append(Problem(where, f"probes pinned to {dev} (SO_BINDTODEVICE) get no answer ({f.pinned_error}) "
                                  "while routed ones do",
                           f"check {dev}'s own link to the peer: `ip link show {dev}`, the cable, the switch port"))
    return out


def judge_mtu(f: PairFacts) -> tuple[str, list[Problem]]:
    """Equal MTU at both ends, and a full-size don't-fragment datagram crosses each way."""
    where, dev = _pair_where(f), f.rail.ifname
    here, there, peer_if = f.rail.iface.mtu, f.peer_mtu, f.peer_if or "its rail"
    lost = []
    if f.out_largest is not None:
        lost.append(f"{min(here, 65535)}-byte packets from here are lost, the largest that crossed is {f.out_largest}")
    if f.back_largest is not None and there:
        lost.append(f"{min(there, 65535)}-byte packets from the peer are lost, the largest that crossed is "
                    f"{f.back_largest}")
    detail = f": {'; '.join(lost)}" if lost else ""
    if there and there != here:
        return f"{here}/{there}", [Problem(
            where, f"MTU differs: {dev} {here} here, {peer_if} {there} on the peer{detail}",
            f"one MTU on both ends and the switch ports between: `ip link set dev {dev} mtu {there}` here, or "
            f"`ip link set dev {peer_if} mtu {here}` on the peer")]
    if lost:
        smallest = min(x for x in (f.out_largest, f.back_largest) if x is not None)
        return f"{here} lost", [Problem(
            where, f"full-size don't-fragment packets do not cross, a switch or port between has a smaller MTU{detail}",
            f"raise the MTU on the way to {here}, or lower both ends: `ip link set dev {dev} mtu {smallest}` here "
            f"and on the peer's {peer_if}")]
    return str(here), []


def judge_pair(f: PairFacts) -> tuple[dict, list[Problem]]:
    """Table cells (port, path, mtu) and the problems of one rail pair, bandwidth aside."""
    if not f.answered:
        return {"port": f.tcp, "path": "-", "mtu": "-"}, [judge_silent(f)]
    where, problems = _pair_where(f), []
    cells = {"port": "ok" if f.tcp == "ok" else f"tcp {f.tcp}"}
    if f.tcp != "ok":
        problems.append(Problem(where, f"tcp/{f.port} to {f.dst}: {f.tcp} while udp/{f.port} answers: a firewall "
                                       "drops TCP to it",
                                f"allow tcp {f.port} to {f.dst} in the peer's firewall, and the ephemeral ports r2cc "
                                "listens on (its net.ipv4.ip_local_port_range)"))
    if f.routed is None and f.pinned is None:
        why = ("nothing listens there (refused)" if f.routed_error == "refused"
               else "a firewall drops UDP")
        problems.append(Problem(where, f"udp/{f.port} to {f.dst} gets no answer while tcp/{f.port} does: {why}, "
                                       "so path and MTU were not checked",
                                f"allow udp {f.port} to {f.dst} in the peer's firewall while r2cc doctor runs"))
        cells.update(path="udp blocked", mtu="-")
        return cells, problems
    path = judge_path(f)
    cells["path"] = "ok" if not path else "WRONG NIC" if f.routed else "routed lost"
    cells["mtu"], mtu = judge_mtu(f)
    return cells, problems + path + mtu


def judge_peer(peer: Peer, facts: list[PairFacts], port: int) -> Problem | None:
    """One line for a peer that answered on no rail (else None: its rails speak for themselves)."""
    if not facts or any(f.answered for f in facts):
        return None
    where = f"peer {peer.label}"
    if all("refused" in (f.tcp, f.routed_error) for f in facts):
        return Problem(where, f"not answering on port {port} (connection refused on every rail)",
                       "start `r2cc doctor --serve` there")
    if any(f.arp in netinfo.RESOLVED for f in facts):
        return Problem(where, f"not answering on port {port} on any rail (timed out; its NICs answer ARP)",
                       f"start `r2cc doctor --serve` there, or allow tcp and udp {port} in its firewall")
    return Problem(where, "no answer on any rail, not even to ARP",
                   "check that it is up and cabled, and that its rail addresses are given in rail order")


def slow_rails(mbit: dict[int, float]) -> dict[int, float]:
    """{rail: its siblings' median} for each rail under SLOW_FRACTION of that median."""
    out = {}
    for k, v in mbit.items():
        others = [x for j, x in mbit.items() if j != k]
        if others:
            med = statistics.median(others)
            if v < SLOW_FRACTION * med:
                out[k] = med
    return out


def judge_slow(f: PairFacts, median_out: float | None, median_in: float | None) -> Problem:
    """A rail far slower than its siblings, one way or both (the medians of the ways it is slow)."""
    dev = f.rail.ifname
    ways = [f"{got:.0f} Mbit/s {way} (its sibling rails: {med:.0f})"
            for got, way, med in ((f.mbit_out, "to the peer", median_out), (f.mbit_in, "from the peer", median_in))
            if med is not None]
    return Problem(_pair_where(f), f"{' and '.join(ways)}: under half of its siblings",
                   f"check {dev}'s speed and duplex (`ethtool {dev}`), errors (`ip -s link show {dev}`) and "
                   f"shaping (`tc qdisc show dev {dev}`), here and on the peer")


def judge_data_port(f: PairFacts) -> Problem:
    ports = ((f.hello or {}).get("settings") or {}).get("sysctl", {}).get("net.ipv4.ip_local_port_range")
    span = "-".join(ports.split()) if ports else "its net.ipv4.ip_local_port_range"
    return Problem(_pair_where(f), f"tcp/{f.port} answers but the peer's ephemeral data port does not "
                                   f"({f.bandwidth_error}): r2cc listens on ephemeral ports",
                   f"allow tcp {span} to {f.dst} in the peer's firewall")


def shared_subnet(rails: list[tuple[str, Iface]]) -> bool:
    """Two rails on different NICs in one subnet: ARP and routing need care (see settings.py)."""
    nets = [(i.name, i.network(a)) for a, i in rails if i and not i.loopback and i.network(a)]
    return any(a[0] != b[0] and a[1].overlaps(b[1]) for n, a in enumerate(nets) for b in nets[n + 1:])


def judge_rails(rails: list[Rail]) -> tuple[list[Problem], dict[int, str]]:
    """Problems of this host's own rails, and {rail: table cell} for those that cannot be probed."""
    problems, skip = [], {}
    for r in rails:
        where, dev = f"rail {r.index} ({dev_name(r)})", r.ifname
        if r.addr is None:
            skip[r.index] = "no address"
            problems.append(Problem(where, "has no IPv4 address", f"`ip addr add ADDRESS/PREFIX dev {dev}`"))
        elif not r.iface.up:
            skip[r.index] = "link down here"
            problems.append(Problem(where, "link is down here", f"`ip link set dev {dev} up`"))
        elif not r.iface.carrier:
            skip[r.index] = "no carrier"
            problems.append(Problem(where, "no carrier: the cable, the switch port or the NIC at the far end is down",
                                    f"check `ip link show {dev}` (and `ethtool {dev}`) here and at the far end, "
                                    "the cable and the switch port"))
    by_dev: dict[str, list[int]] = {}
    for r in rails:
        if not r.iface.loopback:
            by_dev.setdefault(r.ifname, []).append(r.index)
    for dev, ks in by_dev.items():
        if len(ks) > 1:
            problems.append(Problem(f"rails {','.join(map(str, ks))}", f"all on {dev}: one NIC failing takes them all",
                                    "give each rail its own NIC"))
    return problems, skip


def dev_name(r: Rail) -> str:
    return r.ifname if r.addr is None else f"{r.ifname} {r.addr}"


def judge_settings(label: str, values: dict, rail_ifnames: list[str], shared: bool,
                   remote: bool) -> tuple[list[settings.Setting], list[Problem]]:
    rows = settings.judge(values, rail_ifnames, shared)
    where = label if not remote else f"peer {label}"
    return rows, [Problem(where, s.what, s.fix + (" there" if remote else "")) for s in rows if s.verdict == "problem"]


# --- probing ------------------------------------------------------------------------------------

def probe_pair(rail: Rail, peer: Peer, port: int, t: Timeouts, ifaces: dict[str, Iface]) -> PairFacts:
    f = PairFacts(rail=rail, dst=peer.addrs[rail.index], port=port)
    f.route_dev = netinfo.route_dev(f.dst, rail.addr)
    # Side by side: on a silent path each waits out its own timeout, and they should not add up.
    with ThreadPoolExecutor(max_workers=3) as pool:
        for done in [pool.submit(_control, f, peer, t), pool.submit(_routed, f, t, ifaces), pool.submit(_pinned, f, t)]:
            done.result()
    f.arp = netinfo.neighbour_state(f.dst, rail.ifname)
    return f


def _control(f: PairFacts, peer: Peer, t: Timeouts) -> None:
    try:
        with Control(f.rail.addr, f.dst, f.port, t.connect_s) as ctrl:
            f.hello = ctrl.hello(list(peer.addrs))
    except ProbeError as exc:
        f.tcp, f.tcp_detail = exc.kind, exc.detail


def _routed(f: PairFacts, t: Timeouts, ifaces: dict[str, Iface]) -> None:
    f.routed, f.routed_error, udp = _path(f.rail.addr, f.dst, f.port, None, "route", t)
    if udp:
        udp.close()
    if f.routed is not None:
        f.routed_here = next((i.name for i in ifaces.values() if i.index == f.routed.arrived), str(f.routed.arrived))


def _pinned(f: PairFacts, t: Timeouts) -> None:
    f.pinned, f.pinned_error, udp = _path(f.rail.addr, f.dst, f.port, f.rail.ifname, "device", t)
    reply = f.pinned
    if f.pinned_error == "unsupported":  # SO_BINDTODEVICE needs root before Linux 5.7: MTU as routed
        reply, _, udp = _path(f.rail.addr, f.dst, f.port, None, "device", t)
    if udp:
        with udp:
            if reply is not None:
                _mtu(f, udp, reply.fields.get("holder_mtu") or 0, t)


def _path(src: str, dst: str, port: int, device: str | None, mode: str, t: Timeouts):
    try:
        udp = Udp(src, dst, port, device)
    except ProbeError as exc:
        return None, "unsupported" if device and exc.kind == "blocked" else exc.kind, None
    try:
        return udp.path(mode, t.path_s), None, udp
    except ProbeError as exc:
        return None, exc.kind, udp


def _mtu(f: PairFacts, udp: Udp, peer_mtu: int, t: Timeouts) -> None:
    # The full size gets a path probe's patience (a verdict rests on it); the search after a
    # loss, a round's: a size answered late there only makes the reported largest smaller.
    here, there = min(f.rail.iface.mtu, 65535), min(peer_mtu, 65535)
    if here not in udp.passes_out([here], t.path_s, t.path_s / 3):
        f.out_largest = largest_passing(lambda s: udp.passes_out(s, t.mtu_round_s), Udp.SMALL, here)
    if there and there not in udp.passes_back([there], t.path_s, t.path_s / 3):
        f.back_largest = largest_passing(lambda s: udp.passes_back(s, t.mtu_round_s), Udp.SMALL, there)


def _bandwidth(f: PairFacts, port: int, seconds: float, t: Timeouts) -> None:
    f.mbit_out = f.mbit_in = f.bandwidth_error = None
    f.data_port_shut = False
    try:
        with Control(f.rail.addr, f.dst, port, t.connect_s) as ctrl:
            f.mbit_out = ctrl.bandwidth(True, seconds)
            f.mbit_in = ctrl.bandwidth(False, seconds)
    except ProbeError as exc:
        f.bandwidth_error, f.data_port_shut = exc.detail, exc.kind == "data_port"


# --- the whole run ------------------------------------------------------------------------------

def run(host: str, rails: list[Rail], peers: list[Peer], port: int, bandwidth_s: float,
        t: Timeouts = TIMEOUTS) -> Report:
    started = time.monotonic()
    report = Report(host, port, rails, peers)
    ifaces = netinfo.interfaces()
    report.problems, skip = judge_rails(rails)
    jobs = [(p, r) for p in peers for r in rails if r.index not in skip]
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(jobs)))) as pool:
        probed = dict(zip(jobs, pool.map(lambda job: probe_pair(job[1], job[0], port, t, ifaces), jobs)))
    report.pairs = [PairResult(p, probed.get((p, r)) or PairFacts(r, p.addrs[r.index], port, tcp="-"))
                    for p in peers for r in rails]
    if bandwidth_s > 0:
        _measure_bandwidth([res for res in report.pairs if res.facts.tcp == "ok"], port, bandwidth_s, t)

    for peer in peers:
        mine = [res for res in report.pairs if res.peer is peer and res.facts.tcp != "-"]
        whole = judge_peer(peer, [res.facts for res in mine], port)
        report.problems += [whole] if whole else []
        for res in mine:
            res.cells, res.problems = judge_pair(res.facts)
            res.cells["bandwidth"] = _bandwidth_cell(res.facts)
            if res.facts.data_port_shut:
                res.cells["port"] = "data port"
                res.problems.append(judge_data_port(res.facts))
            elif res.facts.bandwidth_error:
                res.problems.append(Problem(_pair_where(res.facts), f"the bandwidth probe failed "
                                            f"({res.facts.bandwidth_error})",
                                            "run it again; if it fails again, see what the peer's responder printed"))
            if not whole:
                report.problems += res.problems
        report.problems += _slow_problems([res.facts for res in mine])
    for res in report.pairs:
        if res.facts.tcp == "-":
            res.cells = {"port": "-", "path": skip[res.facts.rail.index], "mtu": "-", "bandwidth": "-"}

    names = [r.ifname for r in rails]
    rows, problems = judge_settings("here", settings.collect(names), names,
                                    shared_subnet([(r.addr, r.iface) for r in rails if r.addr]), False)
    report.settings["here"] = rows
    report.problems += problems
    for peer in peers:
        hello = next((res.facts.hello for res in report.pairs if res.peer is peer and res.facts.hello), None)
        if hello:
            report.settings[peer.label], problems = _peer_settings(peer, hello)
            report.problems += problems
    report.seconds = time.monotonic() - started
    return report


def _peer_settings(peer: Peer, hello: dict):
    ifaces = {name: Iface.from_dict(d) for name, d in (hello.get("ifaces") or {}).items()}
    names = [n for n in hello.get("rails") or [] if n]
    pairs = [(a, ifaces.get(n)) for a, n in zip(peer.addrs, hello.get("rails") or []) if n]
    return judge_settings(peer.label, hello.get("settings") or {}, sorted(set(names)), shared_subnet(pairs), True)


def _measure_bandwidth(ready: list[PairResult], port: int, seconds: float, t: Timeouts) -> None:
    # One pair at a time: rails measured side by side would share this host's CPU and look alike.
    for res in ready:
        _bandwidth(res.facts, port, seconds, t)
    # A rail that looks slow is measured once more: a busy host can slow one short probe.
    for peer in {id(res.peer): res.peer for res in ready}.values():
        mine = [res.facts for res in ready if res.peer is peer]
        again = {k for to_peer in (True, False) for k in slow_rails(_mbits(mine, to_peer))}
        for f in mine:
            if f.rail.index in again:
                _bandwidth(f, port, seconds, t)


def _mbits(facts: list[PairFacts], to_peer: bool) -> dict[int, float]:
    got = {f.rail.index: (f.mbit_out if to_peer else f.mbit_in) for f in facts}
    return {k: v for k, v in got.items() if v is not None}


def _slow_problems(facts: list[PairFacts]) -> list[Problem]:
    out, back = slow_rails(_mbits(facts, True)), slow_rails(_mbits(facts, False))
    return [judge_slow(f, out.get(f.rail.index), back.get(f.rail.index)) for f in facts
            if f.rail.index in out or f.rail.index in back]


def _bandwidth_cell(f: PairFacts) -> str:
    if f.mbit_out is None or f.mbit_in is None:
        return "-" if not f.bandwidth_error else "failed"
    return f"{f.mbit_out:.0f} / {f.mbit_in:.0f}"
