"""`r2cc doctor` on the fault lab, 2 hosts x 4 rails at 1 Gbit/s: a healthy lab is all ok, and
each misconfiguration made on purpose is named in one line with its fix.

Its own lab prefix (r2ccdoc) and state file, so nobody else's lab is touched; one lab for the
module, each test undoing its own damage.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from r2cc_testbed.doctor_lab import check_from, doctor_argv, responders
from r2cc_testbed.lab import netns
from r2cc_testbed.lab.session import lab_session

pytestmark = [pytest.mark.lab, pytest.mark.requires("root", "ip", "nft")]

PREFIX = "r2ccdoc"
STATE = f"/run/r2cc-lab/{PREFIX}-state.json"
PORT = 29640
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def lab():
    # Another lab may hold our subnet for a while (prefixes can share one): wait for it.
    with lab_session(hosts=2, rails=4, rate="1gbit", prefix=PREFIX, state=STATE, wait_s=180) as lab:
        yield lab


def timed(name: str, run):
    started = time.monotonic()
    out = run()
    print(f"[doctor lab] {name}: {time.monotonic() - started:.1f} s", flush=True)
    return out


def doctor_lab(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, R2CC_LAB_PREFIX=PREFIX, R2CC_LAB_STATE=STATE, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "r2cc_serve.cli", "doctor", "--lab", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def problems(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.startswith("  ") and "; fix: " in line]


def by_host(text: str) -> dict[str, list[str]]:
    """The problem lines of each `=== from HOST ===` section of `r2cc doctor --lab`."""
    out, host = {}, None
    for line in text.splitlines():
        if line.startswith("=== from "):
            host = line.split()[2]
            out[host] = []
        elif host and line.startswith("  ") and "; fix: " in line:
            out[host].append(line.strip())
    return out


def test_a_healthy_lab_flags_nothing(lab):
    proc = timed("healthy 2x4, from both hosts (--lab)", doctor_lab)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("r2cc doctor: every check ok (exit 0)") == 2
    assert by_host(proc.stdout) == {"r2ccdoc-h0": [], "r2ccdoc-h1": []}
    assert proc.stdout.count("  ok    ok    1500  ") == 8  # port, path, mtu of every rail pair, both ways


def test_a_rail_routed_out_of_another_nic(lab):
    ns0, peer = lab.host_ns(0), lab.rail_ip(1, 2)
    netns.ip(ns0, "route", "add", f"{peer}/32", "dev", "rail0")  # rail 2's peer reached by NIC 0
    try:
        proc = timed("rail 2 of h0 routed by rail0 (--lab)", doctor_lab)
    finally:
        netns.ip(ns0, "route", "del", f"{peer}/32", "dev", "rail0")
    print(proc.stdout)
    found = by_host(proc.stdout)
    assert proc.returncode == 1 and len(found["r2ccdoc-h0"]) == 1 and len(found["r2ccdoc-h1"]) == 1, found
    assert found["r2ccdoc-h0"][0].startswith(f"rail 2 -> {peer}: packets from {lab.rail_ip(0, 2)} leave by rail0, not "
                                            "rail2")
    assert f"ip rule add from {lab.rail_ip(0, 2)} table 102" in found["r2ccdoc-h0"][0]
    assert found["r2ccdoc-h1"][0].startswith(f"rail 2 -> {lab.rail_ip(0, 2)}: the peer sends to {peer} by its rail0, "
                                            "not rail2")


def test_two_rails_in_one_subnet_without_arp_ignore(lab):
    # rail3 moves into rail2's subnet on both hosts: NIC 2 answers ARP for rail 3's address.
    moved = {i: (lab.rail_ip(i, 3), f"{lab.rail_ip(i, 2)}1") for i in (0, 1)}
    for i, (old, new) in moved.items():
        netns.ip(lab.host_ns(i), "addr", "del", f"{old}/24", "dev", "rail3")
        netns.ip(lab.host_ns(i), "addr", "add", f"{new}/24", "dev", "rail3")
    peer = ",".join([lab.rail_ip(1, k) for k in range(3)] + [moved[1][1]])
    try:
        with responders(lab, PORT, hosts=[1]):
            proc = timed("rails 2 and 3 in one subnet (h0 checks h1)", lambda: subprocess.run(
                doctor_argv(lab, 0, "--peer", peer), capture_output=True, text=True, timeout=120,
                env=dict(os.environ, PYTHONPATH=ROOT)))
    finally:
        for i, (old, new) in moved.items():
            netns.ip(lab.host_ns(i), "addr", "del", f"{new}/24", "dev", "rail3")
            netns.ip(lab.host_ns(i), "addr", "add", f"{old}/24", "dev", "rail3")
    print(proc.stdout)
    found = problems(proc.stdout)
    assert proc.returncode == 1 and len(found) == 4, found
    assert found[0].startswith(f"rail 3 -> {moved[1][1]}: packets from {moved[0][1]} leave by rail2, not rail3")
    assert found[1].startswith(f"rail 3 -> {moved[1][1]}: the peer sends to {moved[0][1]} by its rail2, not rail3")
    assert found[2].startswith("here: rails share a subnet") and "arp_ignore=1" in found[2]
    assert found[3].startswith(f"peer {lab.rail_ip(1, 0)}: rails share a subnet") and found[3].endswith("there")


def test_an_mtu_mismatch(lab):
    netns.ip(lab.host_ns(1), "link", "set", "rail1", "mtu", "1400")
    try:
        proc = timed("rail1 of h1 at MTU 1400 (--lab)", doctor_lab)
    finally:
        netns.ip(lab.host_ns(1), "link", "set", "rail1", "mtu", "1500")
    found = by_host(proc.stdout)
    print("\n".join(found["r2ccdoc-h0"] + found["r2ccdoc-h1"]))
    assert proc.returncode == 1 and len(found["r2ccdoc-h0"]) == 1 and len(found["r2ccdoc-h1"]) == 1, found
    assert found["r2ccdoc-h0"][0].startswith(f"rail 1 -> {lab.rail_ip(1, 1)}: MTU differs: rail1 1500 here, rail1 "
                                            "1400 on the peer: 1500-byte packets from here are lost")
    assert "`ip link set dev rail1 mtu 1400` here" in found["r2ccdoc-h0"][0]
    assert "1500-byte packets from the peer are lost" in found["r2ccdoc-h1"][0]


def test_the_doctor_port_blocked_on_one_rail(lab):
    table = f"{PREFIX}_doctor_block"
    netns.nft(lab.host_ns(1), f"table inet {table} {{\n  chain input {{ type filter hook input priority 0; "
                              f"policy accept; iifname \"rail1\" meta l4proto {{ tcp, udp }} th dport {PORT} drop; }}\n}}\n")
    try:
        proc = timed("port blocked by nftables on rail1 of h1 (--lab)", doctor_lab)
    finally:
        netns.nft(lab.host_ns(1), f"add table inet {table}\ndelete table inet {table}\n")
    found = by_host(proc.stdout)
    print("\n".join(found["r2ccdoc-h0"] + found["r2ccdoc-h1"]))
    assert proc.returncode == 1 and found["r2ccdoc-h1"] == [] and len(found["r2ccdoc-h0"]) == 1, found
    assert found["r2ccdoc-h0"][0].startswith(f"rail 1 -> {lab.rail_ip(1, 1)}: {lab.rail_ip(1, 1)} answers ARP on rail1 "
                                            f"but port {PORT} times out (tcp and udp): a firewall drops it")


def test_a_link_down(lab):
    lab.fault(0, 3, "down")
    try:
        proc = timed("rail3 of h0 down (--lab)", doctor_lab)
    finally:
        lab.fault(0, 3, "clear")
    found = by_host(proc.stdout)
    print("\n".join(found["r2ccdoc-h0"] + found["r2ccdoc-h1"]))
    assert proc.returncode == 1
    assert found["r2ccdoc-h0"] == [f"rail 3 (rail3 {lab.rail_ip(0, 3)}): link is down here; "
                                  "fix: `ip link set dev rail3 up`"]
    assert len(found["r2ccdoc-h1"]) == 1 and found["r2ccdoc-h1"][0].startswith(
        f"rail 3 (rail3 {lab.rail_ip(1, 3)}): no carrier")


def test_a_rail_far_slower_than_its_siblings(lab):
    lab.fault(0, 1, "degrade", "200mbit")
    try:
        with responders(lab, PORT, hosts=[1]):
            proc = timed("rail1 of h0 shaped to 200mbit (h0 checks h1)", lambda: check_from(lab, 0))
    finally:
        lab.fault(0, 1, "clear")
    found = problems(proc.stdout)
    print("\n".join(found))
    assert proc.returncode == 1 and len(found) == 1, found
    assert found[0].startswith(f"rail 1 -> {lab.rail_ip(1, 1)}: ") and "Mbit/s to the peer" in found[0]
    assert "Mbit/s from the peer" in found[0] and "under half of its siblings; fix: check rail1's speed" in found[0]


def test_a_peer_not_running_the_responder(lab):
    proc = timed("h1 runs no responder (h0 checks h1)", lambda: check_from(lab, 0))
    print(proc.stdout)
    assert proc.returncode == 1
    assert problems(proc.stdout) == [f"peer {lab.rail_ip(1, 0)}: not answering on port {PORT} (connection refused "
                                     "on every rail); fix: start `r2cc doctor --serve` there"]
