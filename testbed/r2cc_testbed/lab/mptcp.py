"""Kernel MPTCP in the lab: a subflow per rail, and a peer library run over it.

MPTCP is what any Linux user can turn on without new code: an MPTCP socket opens one TCP
subflow per local endpoint and spreads its bytes over them; a subflow that errors is dropped
and its data goes on the others. The lab gives every host an endpoint per rail beyond rail 0
(`ip mptcp endpoint add ADDR dev railK subflow`, up to 8 subflows), which does nothing to
plain TCP sockets (r2cc's) and gives every MPTCP connection opened to a rail-0 address a
subflow on every rail.

A program becomes MPTCP under Debian's `mptcpize` (package mptcpize), an LD_PRELOAD library
that opens IPPROTO_MPTCP where the program asks for TCP. gloo needs one more preloaded fix
(mptcp_reuseaddr_fix.c, built here on first use): it sets SO_REUSEADDR on accepted sockets,
which this kernel refuses on MPTCP ones, and gloo aborts on that error.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess

from r2cc_serve.errors import UserError
from r2cc_testbed.lab import netns

MAX_SUBFLOWS = 8  # the kernel's cap; one per rail beyond rail 0 is what the lab needs
FIX_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mptcp_reuseaddr_fix.c")
INSTALL_HINT = "apt-get install -y mptcpize (or run scripts/setup.sh)"


def add_endpoints(ns: str, rail_ips: list[tuple[str, str]]) -> None:
    """Give host namespace `ns` a subflow endpoint per (ifname, address) and room for them."""
    netns.ip(ns, "mptcp", "limits", "set", "subflows", str(MAX_SUBFLOWS),
             "add_addr_accepted", str(MAX_SUBFLOWS))
    for ifname, addr in rail_ips:
        netns.ip(ns, "mptcp", "endpoint", "add", addr, "dev", ifname, "subflow")


def endpoints(ns: str) -> list[dict]:
    """The namespace's MPTCP endpoints as the kernel reports them ([] where MPTCP is absent)."""
    try:
        return netns.ip_json(ns, "mptcp", "endpoint", "show")
    except (UserError, ValueError):
        return []


def supported() -> bool:
    """Whether this kernel and iproute2 know MPTCP (sysctl on, `ip mptcp` understood)."""
    try:
        with open("/proc/sys/net/mptcp/enabled") as f:
            if f.read().strip() != "1":
                return False
    except OSError:
        return False
    return subprocess.run(["ip", "mptcp", "limits", "show"], capture_output=True, timeout=10).returncode == 0


def wrap_library() -> str:
    """Path of mptcpize's preload library; UserError naming the package if it is missing."""
    found = sorted(glob.glob("/usr/lib/*/mptcpize/libmptcpwrap.so*") + glob.glob("/usr/lib/mptcpize/libmptcpwrap.so*"))
    if not found:
        raise UserError(f"the MPTCP baselines need Debian's mptcpize (its libmptcpwrap): {INSTALL_HINT}")
    return min(found, key=len)  # the soname link, not a versioned file


def reuseaddr_fix(cache_dir: str | None = None) -> str:
    """Path of the built gloo fix, compiled with the system C compiler on first use.

    The file name carries a hash of the source, so an edited source is rebuilt.
    """
    with open(FIX_SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    cache_dir = cache_dir or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "r2cc")
    target = os.path.join(cache_dir, f"mptcp_reuseaddr_fix-{digest}.so")
    if os.path.exists(target):
        return target
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        raise UserError("the MPTCP baselines build a small preload fix for gloo and need a C compiler: "
                        "apt-get install -y gcc")
    os.makedirs(cache_dir, exist_ok=True)
    tmp = f"{target}.{os.getpid()}.tmp"
    proc = subprocess.run([cc, "-O2", "-Wall", "-shared", "-fPIC", "-o", tmp, FIX_SOURCE, "-ldl"],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise UserError(f"building {FIX_SOURCE} failed: {proc.stderr.strip()[-500:]}")
    os.replace(tmp, target)  # atomic: concurrent first users each build, one file wins
    return target


def preload_env(base: dict | None = None) -> dict:
    """LD_PRELOAD that puts a process (and its children) on MPTCP with the gloo fix.

    Returns the variables to set; an LD_PRELOAD already in `base` is kept after ours.
    """
    libs = [wrap_library(), reuseaddr_fix()]
    before = (base or {}).get("LD_PRELOAD", "")
    return {"LD_PRELOAD": " ".join(libs + ([before] if before else []))}


def counters(ns: str) -> dict[str, int]:
    """The namespace's MPTCP MIB counters (`nstat -az`, names starting MPTcp): subflows joined,
    re-injected data, fallbacks to plain TCP. {} where nstat is missing."""
    if shutil.which("nstat") is None:
        return {}
    proc = subprocess.run(["ip", "netns", "exec", ns, "nstat", "-az", "--json"], capture_output=True, text=True,
                          timeout=30)
    if proc.returncode != 0:
        return {}
    import json

    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        return {}
    out = {}
    for table in doc.values():
        if isinstance(table, dict):
            out.update({k: int(v) for k, v in table.items() if k.startswith("MPTcp")})
    return out
