"""`r2cc lab guest build`: everything the guest boots from, cached (a second build is a no-op).

Steps: missing Debian packages, the kernel package, the initramfs, the portable C++ core. Each
is keyed by its inputs (see cache.py); one build runs at a time per cache.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

import r2cc_testbed
from r2cc_testbed.guest import apt, cache, core, initramfs, kernel
from r2cc_testbed.guest.kernel import Kernel


def _to_stderr(msg: str) -> None:
    print(f"[guest] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Build:
    kernel: Kernel
    initramfs: str
    core_so: str   # the portable r2cc_serve._C, put in place of the checkout's inside the guest
    checkout: str  # the checkout the guest runs (its csrc/ built the core)
    qemu: str


def build(checkout: str | None = None, progress: Callable[[str], None] = _to_stderr) -> Build:
    """Make sure every artifact exists for checkout (default: the one r2cc_serve imports from)."""
    checkout = os.path.abspath(checkout or r2cc_testbed.PROJECT_ROOT)
    apt.require_root()
    core.check_checkout(checkout)
    t0 = time.monotonic()
    with cache.locked(progress):
        apt.install_missing(progress)
        qemu = apt.require_qemu()
        k = kernel.ensure(progress)
        initrd = initramfs.ensure(k, progress)
        so = core.ensure(checkout, progress)
    took = time.monotonic() - t0
    if took > 5:
        progress(f"build done in {took:.0f} s (cache {cache.root()})")
    return Build(k, initrd, so, checkout, qemu)
