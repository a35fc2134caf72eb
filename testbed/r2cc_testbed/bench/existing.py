"""The bench on servers that already exist (`r2cc bench --no-lab`), the way nccl-tests runs
under a launcher: every server runs the same command with its own --rank; rank 0 hosts a torch
TCPStore at --master, and every launch's rank of this server is started here, in this host's
own namespace, on the rails it names. No root, no lab, no faults.

Every wait is bounded by --store-timeout: a rank that never joins is named with the address
it did not reach, and so is one that sends no results.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import socket
import subprocess
import time

from r2cc_serve.errors import UserError
from r2cc_testbed.bench import launch as launch_mod
from r2cc_testbed.bench.launch import say

MPI_SKIP = "needs mpirun to start every rank; run Open MPI's own benchmarks under mpirun on these hosts"


def ifname_of(rail: str) -> str:
    """The interface that holds a rail given as an IPv4 address (gloo is put on interfaces)."""
    try:
        addr = ipaddress.IPv4Address(rail)
    except ValueError:
        return rail
    if addr.is_loopback:
        return "lo"
    try:
        out = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
        for link in json.loads(out or "[]"):
            if any(a.get("local") == rail for a in link.get("addr_info", [])):
                return link["ifname"]
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    raise UserError(f"rail {rail}: no interface of this host has that address")


def mptcp_skip(rails: list[str]) -> str | None:
    """Why gloo-mptcp cannot run here without root, or None when it can: the kernel must have
    MPTCP on, and every rail after the first a subflow endpoint (`ip mptcp endpoint add ADDR
    dev IFNAME subflow`, root) so that MPTCP uses it."""
    from r2cc_testbed.lab import mptcp

    if len(rails) < 2:
        return "one rail: MPTCP has no second path"
    if not mptcp.supported():
        return "this kernel has MPTCP off (sysctl net.mptcp.enabled=1) or iproute2 lacks `ip mptcp`"
    devs = {e.get("dev") for e in mptcp.endpoints(None) if "subflow" in e.get("flags", [])}
    missing = [r for r in (ifname_of(x) for x in rails[1:]) if r not in devs]
    if missing:
        return (f"no MPTCP subflow endpoint on {','.join(missing)} (as root: ip mptcp endpoint add "
                "<addr> dev <rail> subflow; the lab sets them up)")
    try:
        mptcp.preload_env()
    except UserError as exc:
        return str(exc)
    return None


class ExistingHosts:
    """This server's rank; see bench/hosts.py for the interface."""

    lab = None

    def __init__(self, rank: int, world: int, master: tuple[str, int], rails: list[str], backends: list[str],
                 fingerprint: dict, store_timeout_s: float):
        self.rank, self.world, self.rails = rank, world, rails
        self.store_host, self.port = master
        self.backends, self.fingerprint, self.timeout_s = backends, fingerprint, store_timeout_s
        self.skipped: list[dict] = []
        self.gloo_rails = [ifname_of(r) for r in rails]
        self._store = None
        self._joined = False

    @property
    def address(self) -> str:
        return f"{self.store_host}:{self.port}"

    def open(self):
        from torch.distributed import TCPStore

        timeout = datetime.timedelta(seconds=self.timeout_s)
        what = "host the store" if self.rank == 0 else "reach rank 0's store"
        say(f"rank {self.rank} of {self.world}: {what} at {self.address}")
        if self.rank:
            self._reach(time.monotonic() + self.timeout_s)  # before torch, which logs every retry
        try:
            self._store = TCPStore(self.store_host, self.port, is_master=self.rank == 0,
                                   wait_for_workers=False, timeout=timeout)
        except (RuntimeError, OSError) as exc:
            if self.rank == 0:
                raise UserError(f"rank 0 could not host the store at {self.address}: "
                                f"{str(exc).splitlines()[0][:160]}") from None
            raise UserError(f"rank {self.rank}: no store at {self.address} within {self.timeout_s:g} s "
                            "(is rank 0 running there, and the port open?)") from None
        mine = {"fingerprint": self.fingerprint, "skipped": self._local_skips()}
        self._store.set(f"join/{self.rank}", json.dumps(mine))
        joined = self._wait_all("join", "did not join")
        for r, theirs in enumerate(joined):
            if theirs["fingerprint"] != joined[0]["fingerprint"]:
                diff = sorted(k for k in theirs["fingerprint"]
                              if theirs["fingerprint"][k] != joined[0]["fingerprint"].get(k))
                raise UserError(f"rank {r} runs with other options than rank 0 ({', '.join(diff)}): "
                                "every host runs the same command but for --rank")
        reasons = {}
        for r, theirs in enumerate(joined):  # a backend any rank cannot run is skipped by all
            for x in theirs["skipped"]:
                reasons.setdefault(x["backend"], x["reason"] + ("" if r == 0 else f" (rank {r})"))
        self.skipped = [{"backend": b, "reason": reasons[b]} for b in self.backends if b in reasons]
        self._joined = True
        return self._store

    def _reach(self, deadline: float) -> None:
        while True:
            try:
                socket.create_connection((self.store_host, self.port), timeout=1.0).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise UserError(f"rank {self.rank}: no store at {self.address} within {self.timeout_s:g} s "
                                    "(is rank 0 running there, and the port open?)") from None
                time.sleep(0.2)

    def _local_skips(self) -> list[dict]:
        out = []
        for b in self.backends:
            why = MPI_SKIP if b == "mpi" else mptcp_skip(self.rails) if b == "gloo-mptcp" else None
            if why:
                out.append({"backend": b, "reason": why})
        return out

    def _wait_all(self, key: str, failing: str, timeout_s: float | None = None) -> list:
        """Every rank's value under key/<rank>; a one-line UserError naming the ranks missing."""
        keys = [f"{key}/{r}" for r in range(self.world)]
        limit = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        while not self._store.check(keys):
            if time.monotonic() > deadline:
                missing = [str(r) for r, k in enumerate(keys) if not self._store.check([k])]
                raise UserError(f"rank {', '.join(missing)} {failing} within {limit:g} s "
                                f"(store at {self.address}, world {self.world})")
            time.sleep(0.05)
        return [json.loads(self._store.get(k)) for k in keys]

    def start(self, name: str, cfg_path: str, out_dir: str, backend: str, spin_us: int | None):
        return launch_mod.start_local(name, cfg_path, out_dir, backend, self.rank, self.world,
                                      self.gloo_rails, spin_us)

    def gather(self, launch, timeout_s: float) -> list[dict | None]:
        """This rank's results to the store, everyone's back. A peer's launch ends within its own
        budget of ours; a peer whose driver died is named, its rows then carry the error."""
        mine = launch.results()[self.rank] or {"error": "no results file (the rank died)"}
        self._store.set(f"{launch.name}/result/{self.rank}", json.dumps(mine))
        try:
            return self._wait_all(f"{launch.name}/result", "sent no results", timeout_s)
        except UserError as exc:
            say(str(exc))
            keys = [f"{launch.name}/result/{r}" for r in range(self.world)]
            return [json.loads(self._store.get(k)) if self._store.check([k]) else None for k in keys]

    def mptcp_counters(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        """Rank 0 keeps the store up until every rank is done with it (bounded)."""
        if self._store is None or not self._joined:  # a failed join has said what is missing
            return
        try:
            self._store.set(f"done/{self.rank}", "1")
            if self.rank == 0:
                self._wait_all("done", "did not finish")
        except (UserError, RuntimeError) as exc:
            say(str(exc).splitlines()[0])
        self._store = None
