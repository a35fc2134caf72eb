"""The guest's kernel: Debian's own linux-image package, unpacked into the cache.

qemu boots the uncompressed vmlinux directly (the compressed bzImage decompresses very slowly
under TCG); the modules stay in the unpacked tree, which the guest links as /lib/modules/<ver>.
"""

from __future__ import annotations

import lzma
import os
import shutil
import subprocess
import tempfile
import zlib
from dataclasses import dataclass
from typing import Callable

from r2cc_testbed.guest import apt, cache
from r2cc_testbed.guest.apt import GuestError

_XZ_MAGIC = b"\xfd7zXZ\x00"
_GZIP_MAGIC = b"\x1f\x8b\x08"


@dataclass(frozen=True)
class Kernel:
    dir: str
    version: str  # uname -r in the guest, e.g. 6.1.0-56-amd64

    @property
    def vmlinux(self) -> str:
        return os.path.join(self.dir, "vmlinux")

    @property
    def modules(self) -> str:
        """The directory the guest's /lib/modules/<version> points at."""
        return os.path.join(self.dir, "lib", "modules", self.version)


def version_of(package: str) -> str:
    """linux-image-6.1.0-56-amd64 -> 6.1.0-56-amd64."""
    return package.removeprefix("linux-image-")


def ensure(progress: Callable[[str], None]) -> Kernel:
    """The unpacked kernel of the package linux-image-amd64 depends on (downloaded once)."""
    package = apt.kernel_package()
    kernel = Kernel(os.path.join(cache.root(), f"kernel-{package}"), version_of(package))
    if cache.is_fresh(kernel.dir, package):
        return kernel
    path = cache.fresh_dir("kernel", package)
    with tempfile.TemporaryDirectory(dir=cache.root()) as tmp:
        deb = apt.download(package, tmp, progress)
        progress(f"kernel: unpacking {os.path.basename(deb)}")
        _run(["dpkg-deb", "-x", deb, os.path.join(tmp, "pkg")], "unpacking the kernel package")
        shutil.move(os.path.join(tmp, "pkg", "lib"), os.path.join(path, "lib"))
        progress("kernel: decompressing vmlinuz to vmlinux")
        with open(os.path.join(tmp, "pkg", "boot", f"vmlinuz-{kernel.version}"), "rb") as f:
            image = decompress_bzimage(f.read())
    with open(kernel.vmlinux, "wb") as f:
        f.write(image)
    _run(["depmod", "-b", path, kernel.version], "indexing the guest's modules (depmod)")
    cache.mark_fresh(path, package)
    cache.prune("kernel", package, spare=0)
    return kernel


def decompress_bzimage(bzimage: bytes) -> bytes:
    """The vmlinux ELF inside a bzImage: its payload is the first xz (Debian's) or gzip stream."""
    at = bzimage.find(_XZ_MAGIC)
    if at >= 0:
        return lzma.LZMADecompressor().decompress(bzimage[at:])
    at = bzimage.find(_GZIP_MAGIC)
    if at >= 0:
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(bzimage[at:])  # stops at the stream's end
    raise GuestError("the kernel image holds no xz or gzip payload: cannot extract vmlinux")


def _run(argv: list[str], what: str) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    except FileNotFoundError as exc:
        raise GuestError(f"{what}: `{argv[0]}` is missing (apt-get install -y kmod dpkg)") from exc
    if proc.returncode != 0:
        raise GuestError(f"{what}: `{' '.join(argv)}` failed: {proc.stderr.strip() or 'no message'}")
