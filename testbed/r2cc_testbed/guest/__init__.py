"""The emulated RDMA guest: a qemu (TCG) VM running Debian's 6.1 kernel with Soft-RoCE (rdma_rxe),
the host's root shared read-only, in which a command runs against real verbs devices.

    apt.py          Debian packages the guest needs; the kernel package; GuestError
    cache.py        where the build lives; content keys that make a second build a no-op
    kernel.py       the kernel package unpacked: vmlinux and modules
    initramfs.py    the busybox initramfs (stage1_init.sh) that mounts the host's root
    core.py         a portable build of the C++ core (-march the emulator runs)
    builder.py      all of the above, cached (`r2cc lab guest build`)
    topology.py     the rails in the guest: names, addresses, set-up script, env for the command
    job.py          what a run leaves on the guest's share for guest_init.sh
    qemu.py         the qemu command line
    runner.py       boot, run one command, power off; a shell (`r2cc lab guest run`)
    cli.py          `r2cc lab guest build|run|shell`
    pingpong.py     ibv_rc_pingpong over one rail, from inside the guest
    pytest_job.py   a pytest module run inside the guest, its junit XML read back
    rdma_facts.sh   (run inside) what a link down or a killed peer does to a running RC QP

Facts measured in the guest are about function and failover, never performance (all emulated).
"""

from r2cc_testbed.guest.builder import Build, build
from r2cc_testbed.guest.runner import GuestResult, run, shell

__all__ = ["Build", "GuestResult", "build", "run", "shell"]
