"""Lab names and subnets derived from the prefix (pure: no root, no kernel)."""

from __future__ import annotations

import ipaddress

from r2cc_testbed.lab.layout import Layout

# Every lab prefix of the project's own: default, fault/lab tests, e2e, vLLM tests, bench, load tests,
# gray-fault lab tests (testbed and transport), the fault stress, doctor and existing-hosts bench tests. Two labs up at once
# must not share a subnet (the management bridges and routes live in the root namespace).
CI_PREFIXES = ["r2cc", "r2cct", "r2cce", "r2ccv", "r2ccb", "r2ccl", "r2cclq", "r2ccld", "r2ccgy", "r2ccgr", "r2ccss",
               "r2ccdoc", "r2ccx"]


def _subnets(prefix: str) -> set[ipaddress.IPv4Network]:
    lay = Layout(prefix, hosts=3, rails=4)
    nets = {ipaddress.ip_network(lay.mgmt_subnet)}
    nets |= {ipaddress.ip_network(lay.rail_subnet(k)) for k in range(4)}
    return nets


def test_default_prefix_keeps_its_subnets():
    lay = Layout("r2cc", hosts=2, rails=2)
    assert lay.mgmt_ip(0) == "10.200.0.1" and lay.rail_ip(1, 1) == "10.201.1.2"


def test_prefixes_used_side_by_side_get_disjoint_subnets():
    seen: dict[ipaddress.IPv4Network, str] = {}
    for prefix in CI_PREFIXES:
        for net in _subnets(prefix):
            assert net not in seen, f"{prefix} and {seen[net]} share {net}"
            seen[net] = prefix


def test_subnets_are_stable_and_private():
    for prefix in ("r2cct", "lab7", "zz"):
        assert _subnets(prefix) == _subnets(prefix)
        assert all(net.is_private and net.subnet_of(ipaddress.ip_network("10.0.0.0/8"))
                   for net in _subnets(prefix))
