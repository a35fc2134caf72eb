"""A portable copy of the C++ core (r2cc_serve._C) for the guest.

setup.py compiles the core with -march=native; the host has AVX-512 and qemu's TCG does not, so
the host's .so would die of SIGILL in the guest. This builds the checkout's csrc/ again for
MARCH into the cache, keyed by the sources, so it is rebuilt only when they change.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from typing import Callable

from r2cc_testbed.guest import cache
from r2cc_testbed.guest.apt import GuestError

# x86-64-v3 (AVX2, FMA, BMI) is what qemu 7.2's TCG `-cpu max` runs; v4 (AVX-512) it does not.
MARCH = "x86-64-v3"
BUILD_TIMEOUT_S = 1800


def sources(checkout: str) -> list[str]:
    """Every input of the core's build in checkout: csrc/ sources and headers, and setup.py."""
    found = [p for ext in ("cc", "h", "hpp", "cpp") for p in glob.glob(f"{checkout}/csrc/**/*.{ext}", recursive=True)]
    return sorted(found) + [os.path.join(checkout, "setup.py")]


def key(checkout: str, march: str = MARCH) -> str:
    """Changes with any source's content, the target, and the Python ABI the .so is for."""
    return cache.digest(cache.file_digest(sources(checkout), checkout), march, sys.version,
                        sysconfig.get_config_var("EXT_SUFFIX") or "")


def so_name() -> str:
    return "_C" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")


def check_checkout(checkout: str) -> None:
    if not (os.path.isfile(os.path.join(checkout, "setup.py")) and os.path.isdir(os.path.join(checkout, "csrc"))):
        raise GuestError(f"{checkout} is not an r2cc-serve checkout (no setup.py and csrc/): the guest builds "
                         "its core from the checkout's sources; run from a checkout")


def ensure(checkout: str, progress: Callable[[str], None], march: str = MARCH) -> str:
    """Path of the portable _C .so built from checkout's sources (compiled only when they changed)."""
    check_checkout(checkout)
    k = key(checkout, march)
    path = os.path.join(cache.root(), f"core-{k}")
    so = os.path.join(path, "r2cc_serve", so_name())
    if cache.is_fresh(path, k) and os.path.exists(so):
        return so
    path = cache.fresh_dir("core", k)
    n = len([s for s in sources(checkout) if s.endswith((".cc", ".cpp"))])
    progress(f"core: compiling {n} files of {checkout}/csrc for -march={march} (a few minutes on 2 cores)")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(dir=cache.root()) as tmp:
        _build(checkout, path, tmp, march, progress)
    if not os.path.exists(so):
        raise GuestError(f"building the portable core left no {so}")
    cache.mark_fresh(path, k)
    cache.prune("core", k)
    progress(f"core: built in {time.monotonic() - t0:.0f} s")
    return so


def _build(checkout: str, build_lib: str, build_temp: str, march: str, progress) -> None:
    argv = [sys.executable, "setup.py", "build_ext", "--build-lib", build_lib, "--build-temp", build_temp]
    proc = subprocess.Popen(argv, cwd=checkout, env=dict(os.environ, R2CC_MARCH=march), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    killer = threading.Timer(BUILD_TIMEOUT_S, proc.kill)  # a stuck compiler must not hang the build
    killer.start()
    tail: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail = (tail + [line.rstrip()])[-30:]
            src = next((w for w in line.split() if w.endswith((".cc", ".cpp")) and "csrc" in w), None)
            if src and " -c " in line:
                progress(f"core: {src}")
        rc = proc.wait()
    finally:
        killer.cancel()
    if rc < 0:
        raise GuestError(f"building the portable core did not finish within {BUILD_TIMEOUT_S} s")
    if rc != 0:
        raise GuestError(f"building the portable core failed (`{' '.join(argv)}` exit {rc}): "
                         + " | ".join(tail[-5:]))
