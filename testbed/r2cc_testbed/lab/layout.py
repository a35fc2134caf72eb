"""Names and addresses of everything the lab builds, derived from the prefix alone.

Keeping every name in one place lets `down` find a lab by prefix even when the state file is
gone, and lets two labs with different prefixes live side by side.

Subnets: the default prefix "r2cc" uses 10.200.0.0/24 (management) and 10.201.K.0/24 (rail K).
Any other prefix gets its own pair 10.B.0.0/24 and 10.B+1.K.0/24 with B in 202..248 derived from
the prefix (e.g. the tests' "r2cct" uses 10.202/10.203), so labs of different prefixes (tests, a
benchmark, a demo) can run side by side: the management bridge lives in the root namespace, where
two labs with the same subnet would fight over routes. The rare prefix pair that maps to the same
B is refused at `lab up` with a message naming the other lab.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from r2cc_testbed.lab.netns import LabError

DEFAULT_PREFIX = "r2cc"
MAX_HOSTS = 253  # host i has .{i+1}; .254 is the root namespace on the management bridge
MAX_RAILS = 256  # rail k is the third octet
SHAPING_BURST = "256kb"
SHAPING_LATENCY = "20ms"

_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,9}$")  # <prefix>-mgmt must fit IFNAMSIZ (15)



def check_prefix(prefix: str) -> str:
    if not _PREFIX_RE.match(prefix):
        raise LabError(f"R2CC_LAB_PREFIX={prefix!r} is not valid: use 1-10 lowercase letters/digits "
                       "starting with a letter (interface names are limited to 15 characters)")
    return prefix


def check_counts(hosts: int, rails: int, mtu: int) -> None:
    if not 2 <= hosts <= MAX_HOSTS:
        raise LabError(f"--hosts must be between 2 and {MAX_HOSTS} (got {hosts})")
    if not 1 <= rails <= MAX_RAILS:
        raise LabError(f"--rails must be between 1 and {MAX_RAILS} (got {rails})")
    if not 68 <= mtu <= 65535:
        raise LabError(f"--mtu must be between 68 and 65535 (got {mtu})")


@dataclass(frozen=True)
class Layout:
    prefix: str
    hosts: int
    rails: int

    @property
    def switched(self) -> bool:
        """More than two hosts: each rail is a bridge in the switch namespace."""
        return self.hosts > 2

    def check_host(self, i: int) -> int:
        if not isinstance(i, int) or not 0 <= i < self.hosts:
            raise LabError(f"host {i!r} is out of range: the lab has hosts 0..{self.hosts - 1}")
        return i

    def check_rail(self, k: int) -> int:
        if not isinstance(k, int) or not 0 <= k < self.rails:
            raise LabError(f"rail {k!r} is out of range: the lab has rails 0..{self.rails - 1}")
        return k

    # --- namespaces and interfaces ---
    def host_ns(self, i: int) -> str:
        return f"{self.prefix}-h{i}"

    @property
    def switch_ns(self) -> str:
        return f"{self.prefix}-sw"

    def rail_ifname(self, k: int) -> str:
        return f"rail{k}"

    def switch_port(self, i: int, k: int) -> str:
        """Switch-namespace end of host i's rail k veth."""
        return f"h{i}r{k}"

    @property
    def mgmt_bridge(self) -> str:
        return f"{self.prefix}-mgmt"

    def mgmt_root_port(self, i: int) -> str:
        """Root-namespace end of host i's management veth (plugged into the bridge)."""
        return f"{self.prefix}-m{i}"

    mgmt_ifname = "mgmt0"

    def blackhole_table(self, k: int) -> str:
        return f"{self.prefix}_blackhole_rail{k}"

    def lossy_table(self, k: int) -> str:
        return self.drop_table("lossy", k)

    def lossy_far_table(self, i: int, k: int) -> str:
        return self.drop_far_table("lossy", i, k)

    def drop_table(self, kind: str, k: int) -> str:
        """The table of a lossy, gray or marginal fault at the host's own end of rail k."""
        return f"{self.prefix}_{kind}_rail{k}"

    def drop_far_table(self, kind: str, i: int, k: int) -> str:
        """That fault's table at the far end of host i's rail k (the peer host or the switch port)."""
        return f"{self.prefix}_{kind}_h{i}_rail{k}"

    # --- addresses ---
    @property
    def _octets(self) -> tuple[int, int]:
        if self.prefix == DEFAULT_PREFIX:
            return (200, 201)
        base = 202 + 2 * (zlib.crc32(self.prefix.encode()) % 24)
        return (base, base + 1)

    def mgmt_ip(self, i: int) -> str:
        return f"10.{self._octets[0]}.0.{i + 1}"

    @property
    def mgmt_root_ip(self) -> str:
        return f"10.{self._octets[0]}.0.254"

    @property
    def mgmt_subnet(self) -> str:
        return f"10.{self._octets[0]}.0.0/24"

    def rail_ip(self, i: int, k: int) -> str:
        return f"10.{self._octets[1]}.{k}.{i + 1}"

    def rail_subnet(self, k: int) -> str:
        return f"10.{self._octets[1]}.{k}.0/24"

    # --- ownership tests used by `down` without a state file ---
    def owns_netns(self, name: str) -> bool:
        p = re.escape(self.prefix)
        return re.fullmatch(rf"{p}-h\d+|{p}-sw", name) is not None

    def owns_root_link(self, name: str) -> bool:
        p = re.escape(self.prefix)
        return re.fullmatch(rf"{p}-mgmt|{p}-m\d+", name) is not None

    # --- the two egress ends of the link between host i and rail k's fabric ---
    def link_ends(self, i: int, k: int) -> list[tuple[str, str]]:
        """(namespace, device) whose egress shapes host i's rail k: host->fabric, fabric->host."""
        if self.switched:
            return [(self.host_ns(i), self.rail_ifname(k)), (self.switch_ns, self.switch_port(i, k))]
        peer = 1 - i
        return [(self.host_ns(i), self.rail_ifname(k)), (self.host_ns(peer), self.rail_ifname(k))]
