"""Debian packages the guest needs, and the guest kernel's package.

Only missing packages are installed (like scripts/setup.sh's apt_install); the kernel package is
the one linux-image-amd64 depends on, fetched with `apt-get download` (the only download here).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Callable

from r2cc_serve.errors import UserError

# qemu boots the guest; busybox-static is its initramfs; kmod gives depmod/modprobe; rdma-core and
# friends are the verbs user space the guest runs from the host's root; libibverbs-dev builds
# against verbs.
PACKAGES = ("qemu-system-x86", "busybox-static", "rdma-core", "ibverbs-utils", "ibverbs-providers",
            "python3-pyverbs", "kmod", "libibverbs-dev")
KERNEL_META = "linux-image-amd64"
APT_TIMEOUT_S = 1800


class GuestError(UserError):
    """The guest could not be built or run; the message says why and what to do."""


def require_root() -> None:
    if os.geteuid() != 0:
        raise GuestError("the RDMA guest needs root (it installs Debian packages and writes "
                         "/var/cache/r2cc-guest); run it with sudo or as root")


def require_qemu() -> str:
    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        raise GuestError("qemu-system-x86_64 is missing: run `r2cc lab guest build` "
                         "(or `apt-get install -y qemu-system-x86`)")
    return qemu


def missing(packages=PACKAGES) -> list[str]:
    """The packages dpkg does not list as installed."""
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${db:Status-Status}\n", *packages],
                         capture_output=True, text=True).stdout
    installed = {line.split()[0] for line in out.splitlines() if line.endswith(" installed")}
    return [p for p in packages if p not in installed]


def _apt(argv: list[str], what: str, cwd: str | None = None, quiet: bool = True) -> str:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, text=True, timeout=APT_TIMEOUT_S,
                              stdout=subprocess.PIPE if quiet else None, stderr=subprocess.PIPE)
    except FileNotFoundError as exc:
        raise GuestError(f"{what}: `{argv[0]}` is missing (the guest needs Debian's apt)") from exc
    except subprocess.TimeoutExpired as exc:
        raise GuestError(f"{what}: `{' '.join(argv)}` did not finish within {APT_TIMEOUT_S} s") from exc
    if proc.returncode != 0:
        last = (proc.stderr or "").strip().splitlines()[-1:] or ["no error message"]
        raise GuestError(f"{what}: `{' '.join(argv)}` failed: {last[0]}")
    return proc.stdout or ""


def install_missing(progress: Callable[[str], None]) -> list[str]:
    """Install the packages not yet installed; returns them (empty: nothing to do)."""
    todo = missing()
    if todo:
        progress(f"apt: installing {' '.join(todo)} (a minute or two)")
        _apt(["apt-get", "update", "-qq"], "apt-get update")
        _apt(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *todo], "installing the guest's packages")
    return todo


def kernel_package() -> str:
    """The versioned kernel package linux-image-amd64 depends on, e.g. linux-image-6.1.0-56-amd64."""
    def depends() -> str | None:
        out = subprocess.run(["apt-cache", "depends", KERNEL_META], capture_output=True, text=True).stdout
        return parse_kernel_depends(out)

    name = depends()
    if name is None:  # no package lists yet (a fresh image): fetch them once
        _apt(["apt-get", "update", "-qq"], "apt-get update")
        name = depends()
    if name is None:
        raise GuestError(f"apt knows no {KERNEL_META} package: check /etc/apt/sources.list")
    return name


def parse_kernel_depends(apt_cache_depends: str) -> str | None:
    """The first `Depends: linux-image-...` of `apt-cache depends linux-image-amd64`."""
    for line in apt_cache_depends.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == "Depends:" and words[1].startswith("linux-image-"):
            return words[1]
    return None


def download(package: str, dest: str, progress: Callable[[str], None]) -> str:
    """`apt-get download` package into dest; returns the .deb's path."""
    progress(f"apt: downloading {package}")
    _apt(["apt-get", "download", package], f"downloading {package}", cwd=dest, quiet=False)
    debs = [f for f in os.listdir(dest) if f.startswith(package + "_") and f.endswith(".deb")]
    if not debs:
        raise GuestError(f"`apt-get download {package}` left no .deb in {dest}")
    return os.path.join(dest, sorted(debs)[-1])
