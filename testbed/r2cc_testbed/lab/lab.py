"""`Lab`: the Python API of the fault lab (servers are namespaces, rails are veth interfaces).

    lab = Lab.up(hosts=2, rails=4, rate="1gbit")   # tears down an existing lab first
    lab.fault(0, 1, "blackhole"); lab.fault(0, 1, "clear")
    lab.inject(parse_fault_text("h0:1:degrade:100mbit"))     # testbed/r2cc_testbed/faults/model.py
    Lab.down()
"""

from __future__ import annotations

import os
import threading
import time
import uuid

from r2cc_serve import envs
from r2cc_testbed.faults.executor import LAB_DOES
from r2cc_testbed.faults.lab_executor import FlapThread, LabExecutor, LabRecord, Progress
from r2cc_testbed.faults.model import SIZE_FAULTS, FaultSpec, parse_fault_words
from r2cc_testbed.lab import mptcp, netns, ping, state, status, topology
from r2cc_testbed.lab.layout import Layout, check_counts, check_prefix
from r2cc_serve.util.rates import check_rate
from r2cc_testbed.lab.netns import LabError

_UP_TOOLS = ("ip", "tc", "nft", "sysctl")


class Lab:
    """A lab that is up, as recorded in the state file."""

    def __init__(self, recorded: dict, state_path: str):
        self._recorded = recorded
        self.state_path = state_path
        self._layout = Layout(recorded["prefix"], recorded["hosts"], recorded["rails"])

    # --- life cycle -----------------------------------------------------------------------

    @classmethod
    def up(cls, hosts: int = 2, rails: int = 4, rate: str | None = None, mtu: int = 1500) -> "Lab":
        """Build a fresh lab (tearing down any existing one first) and record it."""
        prefix = check_prefix(envs.get("R2CC_LAB_PREFIX"))
        check_counts(hosts, rails, mtu)
        rate = check_rate(rate) if rate else None
        _require_privileges(_UP_TOOLS)
        path = state.state_path()
        with state.locked(path):
            _teardown(prefix, path)
            started = time.monotonic()
            with_mptcp = mptcp.supported()
            topology.build(Layout(prefix, hosts, rails), rate, mtu, with_mptcp)
            recorded = {"id": uuid.uuid4().hex, "prefix": prefix, "hosts": hosts, "rails": rails,
                        "rate": rate, "mtu": mtu, "mptcp": with_mptcp, "state_file": path, "faults": {},
                        "created": time.time(), "build_s": round(time.monotonic() - started, 3)}
            state.write(recorded, path)
        return cls(recorded, path)

    @classmethod
    def load(cls) -> "Lab":
        """The lab that is currently up; LabError if there is none."""
        path = state.state_path()
        recorded = state.read(path)
        if recorded is None:
            raise LabError(f"no lab is up (no state file {path}); "
                           "start one with `r2cc lab up --hosts 2 --rails 4`")
        lab = cls(recorded, path)
        missing = [lab.host_ns(i) for i in range(lab.hosts) if not netns.netns_exists(lab.host_ns(i))]
        if missing:
            raise LabError(f"the lab in {path} is gone (namespace {missing[0]} is missing); "
                           "run `r2cc lab down` and `r2cc lab up` again")
        return lab

    @classmethod
    def down(cls) -> list[str]:
        """Remove the lab (idempotent); found by prefix even without a state file."""
        _require_privileges(("ip",))
        path = state.state_path()
        with state.locked(path):
            return _teardown(check_prefix(envs.get("R2CC_LAB_PREFIX")), path)

    # --- names and addresses --------------------------------------------------------------

    @property
    def prefix(self) -> str:
        return self._layout.prefix

    @property
    def hosts(self) -> int:
        return self._layout.hosts

    @property
    def rails(self) -> int:
        return self._layout.rails

    @property
    def rate(self) -> str | None:
        return self._recorded.get("rate")

    @property
    def mtu(self) -> int:
        return self._recorded["mtu"]

    @property
    def mptcp(self) -> bool:
        """Whether the hosts have an MPTCP subflow endpoint per rail (kernels with MPTCP)."""
        return bool(self._recorded.get("mptcp"))

    def host_ns(self, i: int) -> str:
        return self._layout.host_ns(self._layout.check_host(i))

    def netns_path(self, i: int) -> str:
        return os.path.join(netns.NETNS_DIR, self.host_ns(i))

    @property
    def switch_ns(self) -> str | None:
        """Namespace holding the rail bridges (None for a two-host lab: rails are direct)."""
        return self._layout.switch_ns if self._layout.switched else None

    def rail_ifname(self, k: int) -> str:
        return self._layout.rail_ifname(self._layout.check_rail(k))

    def rail_ip(self, i: int, k: int) -> str:
        """IPv4 address (no mask; the rail subnet is a /24) of host i on rail k."""
        return self._layout.rail_ip(self._layout.check_host(i), self._layout.check_rail(k))

    def rail_subnet(self, k: int) -> str:
        return self._layout.rail_subnet(self._layout.check_rail(k))

    @property
    def mgmt_ifname(self) -> str:
        return self._layout.mgmt_ifname

    def mgmt_ip(self, i: int) -> str:
        return self._layout.mgmt_ip(self._layout.check_host(i))

    @property
    def mgmt_root_ip(self) -> str:
        return self._layout.mgmt_root_ip

    @property
    def mgmt_bridge(self) -> str:
        return self._layout.mgmt_bridge

    # --- faults, status, probes -----------------------------------------------------------

    def fault(self, host: int, rail: int, kind: str, arg=None, *, background: bool = False,
              progress: Progress | None = None) -> threading.Thread | None:
        """Inject (or undo) a fault on host's end of rail; arg: degrade's rate, lossy's percentage,
        flap's (period_ms, count), gray's [DIR] [BYTES] and marginal's PCT [DIR] (one value or a tuple)."""
        return self.inject(_lab_spec(kind, host, rail, arg), background=background, progress=progress)

    def inject(self, spec: FaultSpec, *, background: bool = False,
               progress: Progress | None = None) -> threading.Thread | None:
        """Carry out a lab kind of r2cc_testbed.faults.model (all-down: down on every data rail).

        flap blocks until done unless background=True, which returns the started thread.
        progress, if given, is called with a short message at each flap step.
        """
        if spec.kind not in LAB_DOES:
            raise LabError(f"{spec.kind} is not a lab fault: the lab does {', '.join(LAB_DOES)}")
        thread = None
        for step in spec.per_rail(self.rails):
            thread = self._inject_one(step, background, progress)
        return thread

    def _inject_one(self, spec: FaultSpec, background: bool, progress) -> threading.Thread | None:
        executor = self._executor(spec.host, spec.rail, progress)
        _require_privileges(("ip", "tc", "nft"))
        if spec.kind == "flap" and background:
            thread = FlapThread(executor, spec)
            thread.start()
            return thread
        executor.apply(spec)
        return None

    def status(self) -> dict:
        """JSON-able report: addresses, live link state, shaping, blackholes, recorded faults."""
        _require_privileges(("ip", "tc", "nft"))
        recorded = state.read(self.state_path) or self._recorded
        return status.collect(self._layout, recorded)

    def ping(self, host: int | None, dst_ip: str, timeout_s: float = 1.0) -> bool:
        """One ICMP echo from host's namespace (None: the root namespace) to dst_ip.

        Needs no `ping` binary; True if the reply arrived within timeout_s.
        """
        return ping.ping(None if host is None else self.host_ns(host), dst_ip, timeout_s)

    def _executor(self, host: int, rail: int, progress: Progress | None) -> LabExecutor:
        """The lab's executor, once host and rail are known to exist."""
        self._layout.check_host(host)
        self._layout.check_rail(rail)
        if not netns.netns_exists(self._layout.host_ns(host)):
            raise LabError(f"namespace {self._layout.host_ns(host)} does not exist: "
                           "the lab is down; run `r2cc lab up`")
        return LabExecutor(self._layout, self.rate, self.mtu, LabRecord(self.state_path, self._recorded["id"]), progress)

    def __repr__(self) -> str:
        return (f"Lab(prefix={self.prefix!r}, hosts={self.hosts}, rails={self.rails}, "
                f"rate={self.rate!r}, mtu={self.mtu})")


def _lab_spec(kind: str, host: int, rail: int, arg) -> FaultSpec:
    """The FaultSpec of Lab.fault's positional form, e.g. ("flap", (200, 3))."""
    if kind not in LAB_DOES:
        raise LabError(f"unknown fault kind {kind!r}: use one of {', '.join(LAB_DOES)}")
    if kind == "degrade":
        return FaultSpec(kind, host, rail, rate=arg)
    if kind == "lossy":
        return FaultSpec(kind, host, rail, loss_pct=arg)
    if kind in SIZE_FAULTS:  # the words of `r2cc lab fault`: "out", ("in", 600), (90, "out")
        args = arg if isinstance(arg, (tuple, list)) else [] if arg is None else [arg]
        return parse_fault_words([kind, *(str(a) for a in args)], host, rail)
    if kind == "flap":
        try:
            period_ms, count = arg
        except (TypeError, ValueError):
            raise LabError(f"flap needs (period_ms, count), got {arg!r}") from None
        return FaultSpec(kind, host, rail, period_ms=period_ms, count=count)
    if arg is not None:
        raise LabError(f"{kind} takes no argument, got {arg!r}")
    return FaultSpec(kind, host, rail)


def _require_privileges(tools: tuple[str, ...]) -> None:
    netns.require_root()
    netns.require_tools(*tools)


def _teardown(prefix: str, path: str) -> list[str]:
    """Remove the lab with this prefix and the one the state file describes (if different)."""
    try:
        recorded = state.read(path)
    except LabError:
        recorded = None  # a corrupt state file must not block clean-up
    prefixes = {prefix}
    if recorded and recorded.get("prefix"):
        prefixes.add(recorded["prefix"])
    removed = [item for p in sorted(prefixes) for item in topology.teardown(p)]
    state.remove(path)
    return removed
