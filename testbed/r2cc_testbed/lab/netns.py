"""Thin wrappers around `ip`, `tc`, `nft` and `sysctl` that fail with a clear LabError.

Every kernel change the lab makes goes through `run`, so a failure always names the exact
command and the kernel's message, and a missing tool or missing root says what to do.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from r2cc_serve.errors import UserError

INSTALL_HINT = "apt-get install -y iproute2 nftables procps"
_TOOL_PACKAGE = {"ip": "iproute2", "tc": "iproute2", "nft": "nftables", "sysctl": "procps"}


class LabError(UserError):
    """The lab could not do what was asked; the message says why and what to do."""


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the network lab needs root (network namespaces, veth, tc, nftables); "
                       "run it with sudo or as root")


def require_tools(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        packages = sorted({_TOOL_PACKAGE.get(t, t) for t in missing})
        raise LabError(f"missing command(s) {', '.join(missing)}: "
                       f"install them with `apt-get install -y {' '.join(packages)}`")


def run(argv: list[str], *, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run one command; on failure raise LabError quoting the command and its stderr."""
    try:
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        require_tools(argv[0])
        raise
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"`{' '.join(argv)}` did not finish within 30 s") from exc
    if check and proc.returncode != 0:
        raise LabError(f"`{' '.join(argv)}` failed: {_explain(proc.stderr.strip())}")
    return proc


def _explain(stderr: str) -> str:
    # The kernel's terse messages hide the usual cause: a module the kernel lacks.
    if "Operation not supported" in stderr or "Unknown device type" in stderr:
        return f"{stderr} (the kernel lacks a module: veth, bridge, sch_tbf or nf_tables)"
    return stderr or "no error message"


# --- ip / tc / nft in a namespace (ns=None is the root namespace) -------------------------

def ip(ns: str | None, *args: str, check: bool = True) -> str:
    return run(["ip", *_ns_opt(ns), *args], check=check).stdout


def ip_json(ns: str | None, *args: str) -> list:
    out = run(["ip", "-j", *_ns_opt(ns), *args]).stdout
    return json.loads(out) if out.strip() else []


def tc(ns: str | None, *args: str, check: bool = True) -> str:
    return run(["tc", *_ns_opt(ns), *args], check=check).stdout


def tc_json(ns: str | None, *args: str) -> list:
    out = run(["tc", "-j", *_ns_opt(ns), *args]).stdout
    return json.loads(out) if out.strip() else []


def nft(ns: str | None, script: str) -> str:
    """Load an nft script atomically (one transaction) in namespace ns."""
    return run([*_exec_prefix(ns), "nft", "-f", "-"], stdin=script).stdout


def nft_tables(ns: str | None) -> list[tuple[str, str]]:
    """(family, name) of every nftables table in ns."""
    out = run([*_exec_prefix(ns), "nft", "list", "tables"]).stdout
    return [tuple(line.split()[1:3]) for line in out.splitlines() if line.startswith("table ")]


def sysctl(ns: str | None, settings: dict[str, str]) -> None:
    args = [f"{key}={value}" for key, value in settings.items()]
    run([*_exec_prefix(ns), "sysctl", "-q", "-w", *args])


def _ns_opt(ns: str | None) -> list[str]:
    return ["-n", ns] if ns else []


def _exec_prefix(ns: str | None) -> list[str]:
    return ["ip", "netns", "exec", ns] if ns else []


# --- namespaces ---------------------------------------------------------------------------

NETNS_DIR = "/var/run/netns"


def list_netns() -> list[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def netns_exists(name: str) -> bool:
    return os.path.exists(os.path.join(NETNS_DIR, name))


def add_netns(name: str) -> None:
    ip(None, "netns", "add", name)
    ip(name, "link", "set", "lo", "up")


def delete_netns(name: str) -> None:
    if netns_exists(name):
        ip(None, "netns", "delete", name)


def root_links() -> list[str]:
    return [link["ifname"] for link in ip_json(None, "link", "show")]


def delete_root_link(name: str) -> None:
    ip(None, "link", "delete", name, check=False)  # already gone is fine: idempotent
