"""Inside the guest (run by tests/rdma/test_guest_rails.py in one boot): each rail is its own
RDMA path, and a link down on one rail leaves the others working."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from r2cc_testbed.guest import pingpong, topology

pytestmark = pytest.mark.rdma
RAILS = topology.parse_env(os.environ)
PORT_DIR = "/sys/class/infiniband/{}/ports/1"


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def _wait_state(device: str, state: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while state not in _read(PORT_DIR.format(device) + "/state"):
        assert time.monotonic() < deadline, f"{device} not {state} after {timeout_s} s"
        time.sleep(0.1)


def test_the_env_names_active_devices_on_addressed_netdevs():
    assert len(RAILS) == int(os.environ["R2CC_GUEST_RAILS"]) >= 2
    for rail in RAILS:
        for end in rail.values():
            assert "ACTIVE" in _read(PORT_DIR.format(end["device"]) + "/state")
            addrs = subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", end["netdev"]],
                                   capture_output=True, text=True, check=True).stdout
            assert f" {end['ip']}/" in addrs


def test_the_gid_index_is_each_device_s_ipv4_roce_v2_gid():
    index = os.environ["R2CC_GUEST_GID_INDEX"]
    for rail in RAILS:
        for end in rail.values():
            port = PORT_DIR.format(end["device"])
            assert _read(f"{port}/gid_attrs/types/{index}") == "RoCE v2"
            ip_hex = "".join(f"{int(b):02x}" for b in end["ip"].split("."))
            assert _read(f"{port}/gids/{index}").replace(":", "").endswith("ffff" + ip_hex)


def test_every_rail_pingpongs():
    for i in range(len(RAILS)):
        result = pingpong.run(i, iters=200)
        assert result.ok, (i, result)


def test_a_link_down_fails_its_rail_alone_and_up_brings_it_back():
    down = RAILS[0]["a"]["netdev"]
    subprocess.run(["ip", "link", "set", down, "down"], check=True)
    try:
        _wait_state(RAILS[0]["b"]["device"], "DOWN")  # the veth's other end loses carrier too
        assert not pingpong.run(0, iters=10, timeout_s=30).ok
        for i in range(1, len(RAILS)):
            assert pingpong.run(i, iters=200).ok, f"rail {i} broke when rail 0 went down"
    finally:
        subprocess.run(["ip", "link", "set", down, "up"], check=True)
    for end in RAILS[0].values():
        _wait_state(end["device"], "ACTIVE")
    assert pingpong.run(0, iters=200).ok


def test_the_portable_core_is_the_one_imported():
    import r2cc_serve._C as core

    assert os.path.realpath(core.__file__) == os.path.realpath(os.environ["R2CC_GUEST_CORE"])
