"""Where the ranks of a bench launch run, behind one small interface, so the driver (run.py)
is the same on the lab and on servers that already exist.

    store = hosts.open()          the rendezvous every rank of every launch uses (torch Store)
    hosts.store_host              the address the ranks reach that store on
    hosts.rails                   rail names, as each rank's communicator reads them
    hosts.start(name, cfg_path, out_dir, backend, spin_us) -> Launch
                                  the ranks of one launch that this process starts
    hosts.gather(launch, timeout_s) -> every rank's results file (None: that rank sent none)
    hosts.mptcp_counters()        the kernel's MPTCP counters of the hosts ({} where unknown)
    hosts.close()                 also on errors; what open() built is gone afterwards
    hosts.lab                     the Lab when faults can be injected, else None
    hosts.skipped                 after open(): backends these hosts cannot run, {"backend", "reason"}

LabHosts: the fault lab (a network namespace per host), every rank started here.
ExistingHosts (bench/existing.py): this server runs one rank; its peers run the same command.
"""

from __future__ import annotations

from r2cc_testbed.bench import launch as launch_mod
from r2cc_testbed.bench.launch import say


class LabHosts:
    """The lab brought up for the bench: one rank per namespace host, a store in the root
    namespace that every host reaches over the management bridge."""

    def __init__(self, opts):
        self.o = opts
        self.rails = [f"rail{k}" for k in range(opts.rails)]
        self.lab = None
        self.skipped: list[dict] = []  # the lab runs every backend
        self._cm = None

    def open(self):
        from torch.distributed import TCPStore
        from r2cc_testbed.lab.session import lab_session

        o = self.o
        say(f"lab up: {o.hosts} hosts x {o.rails} rails, rate {o.rate or 'unshaped'}, mtu {o.mtu}")
        # A lab that is already up with our prefix is someone's (a demo, a serving run):
        # lab_session refuses it rather than tearing it down under them.
        cm = lab_session(o.hosts, o.rails, o.rate, keep=o.keep_lab, mtu=o.mtu)
        self.lab = cm.__enter__()
        self._cm = cm
        self.store_host = self.lab.mgmt_root_ip
        return TCPStore(self.store_host, 0, is_master=True, wait_for_workers=False)

    def start(self, name: str, cfg_path: str, out_dir: str, backend: str, spin_us: int | None):
        if backend == "mpi":
            return launch_mod.start_mpi(self.lab, name, cfg_path, out_dir, self.rails)
        return launch_mod.start_netns(self.lab, name, cfg_path, out_dir, backend, self.rails, spin_us)

    def gather(self, launch, timeout_s: float) -> list[dict | None]:
        return launch.results()  # every rank wrote its file here

    def mptcp_counters(self) -> dict[str, int]:
        """The MPTCP MIB counters of every lab host, summed."""
        from r2cc_testbed.lab import mptcp

        total: dict[str, int] = {}
        for i in range(self.o.hosts):
            for k, v in mptcp.counters(self.lab.host_ns(i)).items():
                total[k] = total.get(k, 0) + v
        return total

    def close(self) -> None:
        if self._cm is None:
            return
        self._cm.__exit__(None, None, None)
        say("keeping the lab up (--keep-lab); remove it with `r2cc lab down`" if self.o.keep_lab
            else "lab down")
