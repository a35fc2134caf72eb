"""The guest's busybox initramfs: stage1_init.sh plus the modules it loads to mount the host.

Which .ko files and in what order come from the kernel's own modules.dep, so a new kernel
version needs no list edited here.
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import tempfile

from r2cc_testbed.guest import cache
from r2cc_testbed.guest.apt import GuestError
from r2cc_testbed.guest.kernel import Kernel

BUSYBOX = "/bin/busybox"
STAGE1 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stage1_init.sh")
# What mounting the host's root over virtio-9p under an overlay needs (their dependencies follow).
WANTED = ("virtio_pci", "9pnet_virtio", "9p", "overlay")


def load_order(modules_dep: str, wanted=WANTED) -> list[str]:
    """Module paths (as in modules.dep) to insmod in order: each after what it depends on.

    modules.dep lines read `kernel/fs/9p/9p.ko: kernel/fs/netfs/netfs.ko ...`, dependencies listed
    so that the last one must load first. A wanted module missing from it is taken as built in.
    """
    deps = {}
    for line in modules_dep.splitlines():
        if ":" in line:
            path, rest = line.split(":", 1)
            deps[path.strip()] = rest.split()
    by_name = {_name(p): p for p in deps}
    order: list[str] = []
    for name in wanted:
        path = by_name.get(name)
        if path is None:
            continue
        for p in [*reversed(deps[path]), path]:
            if p not in order:
                order.append(p)
    return order


def _name(path: str) -> str:
    base = os.path.basename(path)
    return base[:base.index(".ko")].replace("-", "_")


def key(kernel: Kernel) -> str:
    with open(STAGE1, "rb") as f, open(BUSYBOX, "rb") as bb:
        return cache.digest(kernel.version, f.read(), bb.read(), " ".join(WANTED))


def ensure(kernel: Kernel, progress) -> str:
    """Path of the initramfs for kernel (built once per kernel, stage-1 script and busybox)."""
    if not os.path.exists(BUSYBOX):
        raise GuestError(f"{BUSYBOX} is missing: apt-get install -y busybox-static")
    k = key(kernel)
    path = os.path.join(cache.root(), f"initramfs-{k}")
    image = os.path.join(path, "initramfs.gz")
    if cache.is_fresh(path, k):
        return image
    progress("initramfs: building (busybox, virtio/9p/overlay modules)")
    path = cache.fresh_dir("initramfs", k)
    with open(os.path.join(kernel.modules, "modules.dep")) as f:
        order = load_order(f.read())
    with tempfile.TemporaryDirectory() as tree:
        for d in ("bin", "mods", "proc", "sys", "dev", "lower", "upper", "newroot"):
            os.makedirs(os.path.join(tree, d))
        shutil.copy(BUSYBOX, os.path.join(tree, "bin", "busybox"))
        os.symlink("busybox", os.path.join(tree, "bin", "sh"))
        for mod in order:
            shutil.copy(os.path.join(kernel.modules, mod), os.path.join(tree, "mods"))
        with open(os.path.join(tree, "mods", "order"), "w") as f:
            f.write("\n".join(os.path.basename(m) for m in order) + "\n")
        shutil.copy(STAGE1, os.path.join(tree, "init"))
        os.chmod(os.path.join(tree, "init"), 0o755)
        with open(image, "wb") as f:
            f.write(gzip.compress(_cpio(tree), compresslevel=1))
    cache.mark_fresh(path, k)
    cache.prune("initramfs", k)
    return image


def _cpio(tree: str) -> bytes:
    """The tree as a newc cpio archive (busybox's cpio, from the package just installed)."""
    names = subprocess.run(["find", "."], cwd=tree, capture_output=True, check=True).stdout
    proc = subprocess.run([BUSYBOX, "cpio", "-o", "-H", "newc"], cwd=tree, input=names, capture_output=True)
    if proc.returncode != 0:
        raise GuestError(f"building the initramfs: busybox cpio failed: {proc.stderr.decode().strip()}")
    return proc.stdout
