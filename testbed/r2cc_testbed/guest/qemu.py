"""The qemu command line that boots the guest (pure: nothing here runs anything).

TCG, not KVM: this machine's /dev/kvm is paravirtual and a stock kernel under it is ~100x slow;
`-cpu max` under TCG gives AVX2 but not AVX-512 (hence core.MARCH). The host's root is shared
read-only (the guest runs the host's Python, tools and checkout), and the run's directory
writable: the guest reads its job there and leaves the command's output and exit code.
"""

from __future__ import annotations

HOST_ROOT_TAG = "hostroot"  # stage1_init.sh mounts these two tags
OUT_TAG = "r2ccout"
SHELL_FLAG = "r2cc.shell=1"  # on the kernel command line: an interactive shell, not the job


def kernel_cmdline(shell: bool = False) -> str:
    # panic=-1: a panic reboots at once, and -no-reboot turns that into qemu exiting.
    words = ["console=ttyS0", "loglevel=4", "panic=-1", "random.trust_cpu=on"]
    return " ".join(words + ([SHELL_FLAG] if shell else []))


def _opt_value(path: str) -> str:
    """A path inside a qemu -option value, where a comma must be doubled."""
    return path.replace(",", ",,")


def argv(qemu: str, vmlinux: str, initramfs: str, out_dir: str, *, smp: int = 2, mem_mb: int = 4096,
         shell: bool = False) -> list[str]:
    return [qemu, "-accel", "tcg,thread=multi", "-cpu", "max", "-smp", str(smp), "-m", str(mem_mb),
            "-nographic", "-no-reboot", "-nic", "none",
            "-kernel", vmlinux, "-initrd", initramfs,
            "-virtfs", f"local,path=/,mount_tag={HOST_ROOT_TAG},security_model=none,readonly=on,multidevs=remap",
            "-virtfs", f"local,path={_opt_value(out_dir)},mount_tag={OUT_TAG},security_model=none,multidevs=remap",
            "-append", kernel_cmdline(shell)]
