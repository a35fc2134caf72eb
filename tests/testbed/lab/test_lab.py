"""The fault lab against the real kernel: namespaces, veth rails, tbf, nftables.

Runs under its own prefix (r2cct, subnets 10.202/10.203) and state file, so a benchmark lab
(prefix r2cc) on the same machine is never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from r2cc_serve.errors import UserError
from r2cc_testbed.faults.model import FaultSpec, parse_fault_text
from r2cc_testbed.lab import Lab, LabError
from r2cc_testbed.lab.cli import parse_host, parse_rail
from r2cc_serve.util.rates import check_rate
from r2cc_testbed.lab import netns
from r2cc_testbed.lab.netns import list_netns, root_links
from tests.conftest import require

pytestmark = pytest.mark.lab

PREFIX = "r2cct"
STATE = "/run/r2cc-lab/test-state.json"
MAIN = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture(autouse=True)
def test_prefix(monkeypatch):
    monkeypatch.setenv("R2CC_LAB_PREFIX", PREFIX)
    monkeypatch.setenv("R2CC_LAB_STATE", STATE)


@pytest.fixture
def root():
    require("root", "ip", "tc", "nft", "sysctl")


@pytest.fixture
def make_lab(root, request):
    """Lab.up(...) with Lab.down() guaranteed afterwards."""
    request.addfinalizer(Lab.down)
    return Lab.up


@pytest.fixture
def lab2(make_lab):
    return make_lab(hosts=2, rails=4, rate="1gbit")


def reachable(lab, src, dst, rail, timeout=1.0):
    return lab.ping(src, lab.rail_ip(dst, rail), timeout)


def comes_back(lab, src, dst, rail, within_s=5.0):
    """Reachable again within `within_s`: a link set up needs a moment for carrier and ARP."""
    deadline = time.monotonic() + within_s
    while not reachable(lab, src, dst, rail):
        if time.monotonic() > deadline:
            return False
    return True


def link(status, host, rail):
    return next(x for x in status["links"] if x["host"] == host and x["rail"] == rail)


def kinds(status, host, rail):
    return {f["kind"]: f["arg"] for f in status["faults"] if (f["host"], f["rail"]) == (host, rail)}


def lab_cli(*args):
    return subprocess.run([sys.executable, "-m", "r2cc_serve.cli", "lab", *args], cwd=MAIN,
                          capture_output=True, text=True, timeout=30)


# --- topology -----------------------------------------------------------------------------

def test_two_hosts_every_rail_and_mgmt_reachable(lab2):
    assert (lab2.hosts, lab2.rails, lab2.rate, lab2.mtu) == (2, 4, "1gbit", 1500)
    assert lab2.host_ns(1) == "r2cct-h1" and lab2.rail_ifname(3) == "rail3"
    assert lab2.rail_ip(1, 3) == "10.203.3.2" and lab2.mgmt_ip(0) == "10.202.0.1"
    for k in range(4):
        assert reachable(lab2, 0, 1, k) and reachable(lab2, 1, 0, k), f"rail {k}"
    assert lab2.ping(0, lab2.mgmt_root_ip) and lab2.ping(0, lab2.mgmt_ip(1))
    assert lab2.ping(None, lab2.mgmt_ip(1))  # root namespace -> host over the mgmt bridge
    v6 = subprocess.run(["ip", "-n", lab2.host_ns(0), "-6", "addr", "show", "dev", "rail0"],
                        capture_output=True, text=True, check=True).stdout
    assert v6.strip() == "", "IPv6 must be disabled on rails"


def test_status_reports_addresses_links_and_shaping(lab2):
    st = lab2.status()
    assert (st["hosts"], st["rails"], st["topology"], st["faults"]) == (2, 4, "direct", [])
    assert len(st["links"]) == 8
    for x in st["links"]:
        assert x["link_up"] and x["mtu"] == 1500 and not x["blackhole"]
        assert x["ip"] == lab2.rail_ip(x["host"], x["rail"])
        assert x["egress_shaping"]["rate_bit"] == 10**9 == x["ingress_shaping"]["rate_bit"]
    assert [h["mgmt_up"] for h in st["host_list"]] == [True, True]
    if lab2.mptcp:  # an MPTCP subflow endpoint on every rail but rail0 (the MPTCP baselines)
        for h in st["host_list"]:
            assert h["mptcp_endpoints"] == [f"{lab2.rail_ip(h['host'], k)} dev rail{k}" for k in (1, 2, 3)], h


def test_three_hosts_switch_with_odd_rail_count(make_lab):
    lab = make_lab(hosts=3, rails=3, mtu=9000)
    assert lab.switch_ns == "r2cct-sw" and "r2cct-sw" in list_netns()
    for k in range(3):
        for src in range(3):
            for dst in range(3):
                if src != dst:
                    assert reachable(lab, src, dst, k), f"h{src}->h{dst} rail {k}"
    st = lab.status()
    assert st["topology"] == "switch" and len(st["links"]) == 9
    assert all(x["egress_shaping"] is None and x["mtu"] == 9000 for x in st["links"])
    # Degrade adds tbf on an unshaped lab, on the host and on the switch port towards it.
    lab.fault(2, 1, "degrade", "20mbit")
    assert link(lab.status(), 2, 1)["ingress_shaping"]["rate_bit"] == 20 * 10**6
    lab.fault(2, 1, "down")
    assert not reachable(lab, 0, 2, 1, 0.3) and reachable(lab, 0, 1, 1)
    lab.fault(2, 1, "clear")
    st = lab.status()
    assert link(st, 2, 1)["egress_shaping"] is None and link(st, 2, 1)["ingress_shaping"] is None
    assert st["faults"] == [] and reachable(lab, 0, 2, 1)


def test_load_finds_the_lab_and_fails_clearly_without_one(lab2):
    loaded = Lab.load()
    assert (loaded.prefix, loaded.hosts, loaded.rails, loaded.rate) == (PREFIX, 2, 4, "1gbit")
    Lab.down()
    with pytest.raises(LabError, match="no lab is up"):
        Lab.load()


# --- faults -------------------------------------------------------------------------------

def test_link_down_breaks_the_rail_and_up_restores_it(lab2):
    lab2.fault(0, 1, "down")
    assert not reachable(lab2, 0, 1, 1, 0.3) and not reachable(lab2, 1, 0, 1, 0.3)
    assert reachable(lab2, 0, 1, 0), "other rails are unaffected"
    st = lab2.status()
    assert not link(st, 0, 1)["link_up"] and kinds(st, 0, 1) == {"down": None}
    lab2.fault(0, 1, "up")
    assert comes_back(lab2, 0, 1, 1) and lab2.status()["faults"] == []
    # status is read from the kernel: a change made by hand shows up too
    subprocess.run(["ip", "-n", lab2.host_ns(1), "link", "set", "rail2", "down"], check=True)
    assert not link(lab2.status(), 1, 2)["link_up"]


def test_blackhole_drops_both_ways_and_clear_restores(lab2):
    lab2.fault(0, 2, "blackhole")
    lab2.fault(0, 2, "blackhole")  # idempotent
    assert not reachable(lab2, 0, 1, 2, 0.3) and not reachable(lab2, 1, 0, 2, 0.3)
    st = lab2.status()
    assert link(st, 0, 2)["blackhole"] and link(st, 0, 2)["link_up"], "a blackhole keeps the link up"
    assert kinds(st, 0, 2) == {"blackhole": None}
    lab2.fault(0, 2, "clear")
    lab2.fault(0, 2, "clear")  # idempotent
    assert reachable(lab2, 0, 1, 2) and reachable(lab2, 1, 0, 2)
    assert not link(lab2.status(), 0, 2)["blackhole"] and lab2.status()["faults"] == []


def test_lossy_drops_a_share_of_packets_both_ways_and_clear_restores(lab2):
    lab2.fault(0, 1, "lossy", 50)
    st = lab2.status()
    assert link(st, 0, 1)["lossy"] and link(st, 0, 1)["link_up"] and not link(st, 0, 2)["lossy"]
    assert kinds(st, 0, 1) == {"lossy": 50.0}
    # dropped where packets arrive, at both ends: the sender's TCP sees a loss on the wire
    assert any(name.endswith("_lossy_h0_rail1") for _, name in netns.nft_tables(lab2.host_ns(1)))
    # 50% each way: an echo and its reply both pass a quarter of the time
    answered = sum(reachable(lab2, 0, 1, 1, 0.05) for _ in range(200))
    assert 20 <= answered <= 90, answered
    lab2.fault(0, 1, "lossy", 0.5)  # replaced, not added to
    assert kinds(lab2.status(), 0, 1) == {"lossy": 0.5}
    lab2.fault(0, 1, "clear")
    assert all(reachable(lab2, 0, 1, 1) for _ in range(10))
    assert not link(lab2.status(), 0, 1)["lossy"] and lab2.status()["faults"] == []
    assert not any("lossy" in name for h in (0, 1) for _, name in netns.nft_tables(lab2.host_ns(h)))


def test_degrade_changes_tbf_both_ways_and_clear_restores(lab2):
    lab2.fault(1, 3, "degrade", "10mbit")
    st = lab2.status()
    assert link(st, 1, 3)["egress_shaping"]["rate_bit"] == 10**7
    assert link(st, 1, 3)["ingress_shaping"]["rate_bit"] == 10**7
    assert link(st, 1, 2)["egress_shaping"]["rate_bit"] == 10**9, "other rails keep their rate"
    tc = subprocess.run(["tc", "-n", lab2.host_ns(1), "qdisc", "show", "dev", "rail3"],
                        capture_output=True, text=True, check=True).stdout
    assert "tbf" in tc and "rate 10Mbit" in tc
    assert kinds(st, 1, 3) == {"degrade": "10mbit"}
    lab2.fault(1, 3, "clear")
    st = lab2.status()
    assert link(st, 1, 3)["egress_shaping"]["rate_bit"] == 10**9 and st["faults"] == []


def test_flap_ends_with_the_link_up(lab2):
    steps = []
    lab2.fault(0, 0, "flap", (40, 3), progress=steps.append)
    assert len(steps) == 6 and steps[-1].endswith("up")
    assert link(lab2.status(), 0, 0)["link_up"] and lab2.status()["faults"] == []
    assert reachable(lab2, 0, 1, 0)
    thread = lab2.fault(1, 0, "flap", (40, 2), background=True)
    assert isinstance(thread, threading.Thread)
    thread.join(5)
    assert not thread.is_alive() and thread.error is None
    assert link(lab2.status(), 1, 0)["link_up"]


def test_specs_of_the_fault_model_and_their_undo(lab2):
    """What the demo, the bench and schedules use: Lab.inject(FaultSpec), undone by spec.undo()."""
    everything = FaultSpec("all-down", host=0)
    lab2.inject(everything)
    st = lab2.status()
    assert not any(link(st, 0, k)["link_up"] for k in range(4)) and lab2.ping(0, lab2.mgmt_ip(1))
    for undo in everything.undo(lab2.rails):
        lab2.inject(undo)
    assert all(comes_back(lab2, 0, 1, k) for k in range(4)) and lab2.status()["faults"] == []
    degrade = parse_fault_text("h1:2:degrade:10mbit")
    lab2.inject(degrade)
    assert kinds(lab2.status(), 1, 2) == {"degrade": "10mbit"}
    [clear] = degrade.undo(lab2.rails)
    lab2.inject(clear)
    assert lab2.status()["faults"] == []
    with pytest.raises(LabError, match="drain is not a lab fault"):
        lab2.inject(FaultSpec("drain", host=0, rail=1))


def test_bad_fault_arguments_raise_lab_error(lab2):
    with pytest.raises(LabError, match="rail 4 is out of range"):
        lab2.fault(0, 4, "down")
    with pytest.raises(LabError, match="host 2 is out of range"):
        lab2.fault(2, 0, "down")
    with pytest.raises(LabError, match="unknown fault kind"):
        lab2.fault(0, 0, "explode")
    with pytest.raises(LabError, match="unknown fault kind 'drain'"):  # not a lab kind
        lab2.fault(0, 0, "drain")
    with pytest.raises(LabError, match="down takes no argument"):
        lab2.fault(0, 0, "down", "now")
    with pytest.raises(UserError, match="rate 'fast' is not valid"):
        lab2.fault(0, 0, "degrade", "fast")
    with pytest.raises(LabError, match="flap needs"):
        lab2.fault(0, 0, "flap", 100)


# --- life cycle ---------------------------------------------------------------------------

def _lab_names():
    netns = [n for n in list_netns() if n.startswith(PREFIX + "-")]
    links = [x for x in root_links() if x.startswith(PREFIX + "-")]
    return netns + links


def test_up_is_idempotent_and_down_removes_everything(make_lab):
    make_lab(hosts=3, rails=2)
    lab = make_lab(hosts=2, rails=1, rate="100mbit")  # replaces the 3-host lab
    assert sorted(n for n in list_netns() if n.startswith(PREFIX)) == ["r2cct-h0", "r2cct-h1"]
    assert reachable(lab, 0, 1, 0)
    Lab.down()
    assert _lab_names() == [] and not os.path.exists(STATE)
    Lab.down()  # idempotent
    assert _lab_names() == []


def test_down_finds_the_lab_by_prefix_without_state_file(make_lab):
    make_lab(hosts=3, rails=1)
    os.remove(STATE)
    assert Lab.down(), "something was removed"
    assert _lab_names() == []


def test_test_prefix_never_touches_the_default_lab(lab2):
    names = [lab2.host_ns(0), lab2.mgmt_bridge] + _lab_names()
    assert all(n.startswith("r2cct-") for n in names)
    assert lab2.mgmt_root_ip == "10.202.0.254"


# --- CLI ----------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["up", "--hosts", "1"], "--hosts must be between 2"),
    (["up", "--rails", "0"], "--rails must be between 1"),
    (["up", "--rate", "fast"], "rate 'fast' is not valid"),
    (["up", "--mtu", "70000"], "--mtu must be between"),
    (["fault", "x1", "0", "down"], "HOST 'x1' is not a host"),
    (["fault", "0", "0", "degrade"], "degrade takes one argument, RATE"),
    (["fault", "0", "0", "flap", "100"], "flap takes PERIOD_MS and COUNT"),
    (["fault", "0", "0", "flap", "100", "x"], "flap needs whole numbers"),
    (["fault", "0", "0", "down", "7"], "down takes no arguments"),
    (["fault", "0", "0", "explode"], "unknown fault kind 'explode'"),
    (["fault", "h0:0:down@30%"], "give seconds into the run, like @3s"),
    (["fault", "h0:0:up+3s"], "up is not undone later"),
])
def test_cli_rejects_bad_input_cleanly(args, message):
    proc = lab_cli(*args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_cli_fault_and_status_on_a_running_lab(lab2):
    assert lab_cli("fault", "r2cct-h0", "rail1", "down").returncode == 0
    proc = lab_cli("fault", "h9", "0", "down")
    assert proc.returncode == 2 and "host 9 is out of range" in proc.stderr
    proc = lab_cli("fault", "0", "7", "down")
    assert proc.returncode == 2 and "rail 7 is out of range" in proc.stderr
    proc = lab_cli("fault", "1", "0", "flap", "40", "1")
    assert proc.returncode == 0 and "flap 1/1" in proc.stderr
    st = json.loads(lab_cli("status").stdout)
    assert not link(st, 0, 1)["link_up"] and kinds(st, 0, 1) == {"down": None}


def test_cli_fault_in_the_notation_is_undone_after_its_time(lab2):
    """`r2cc lab fault h1:2:degrade:10mbit@0.3s+1.5s`: in place from 0.3 s to 1.8 s, then cleared."""
    proc = subprocess.Popen([sys.executable, "-m", "r2cc_serve.cli", "lab", "fault", "h1:2:degrade:10mbit@0.3s+1.5s"],
                            cwd=MAIN, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = set()
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:
        seen.add(tuple(sorted(kinds(json.loads(lab_cli("status").stdout), 1, 2).items())))
        time.sleep(0.1)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert (("degrade", "10mbit"),) in seen, seen  # it was in place while the command waited
    assert "undone (clear) after 1.5 s" in out and "s left" in err, (out, err)
    assert kinds(json.loads(lab_cli("status").stdout), 1, 2) == {}


def test_cli_without_a_lab_says_how_to_start_one(root):
    Lab.down()
    proc = lab_cli("status")
    assert proc.returncode == 2 and "lab up" in proc.stderr and "Traceback" not in proc.stderr


# --- no root / no tools (run anywhere) ----------------------------------------------------

def test_not_root_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(LabError, match="needs root"):
        Lab.up(hosts=2, rails=1)


def test_missing_tools_say_what_to_install(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda _tool: None)
    with pytest.raises(LabError, match="apt-get install -y iproute2 nftables"):
        Lab.up(hosts=2, rails=1)


def test_input_parsers():
    assert [parse_host(x) for x in ("0", "h3", "r2cct-h12")] == [0, 3, 12]
    assert [parse_rail(x) for x in ("2", "rail5")] == [2, 5]
    assert check_rate("1Gbit") == "1gbit" and check_rate("2.5gbit") == "2.5gbit"
    for bad in ("", "1", "gbit", "0mbit", "1 gbit", "-1mbit"):
        with pytest.raises(UserError, match="is not valid"):
            check_rate(bad)
