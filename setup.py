"""Builds the C++ core r2cc_serve._C; the torch pin comes from r2cc_serve/pins.py (other
metadata lives in pyproject.toml)."""

import glob
import os
import runpy

from pybind11.setup_helpers import Pybind11Extension
from setuptools import setup

# Built on the machine that runs it, so native vector units (AVX2/AVX-512) are safe. R2CC_MARCH names
# another target for a copy that runs elsewhere (the emulated RDMA guest: qemu's TCG has no AVX-512).
MARCH = os.environ.get("R2CC_MARCH") or "native"

ext = Pybind11Extension(
    "r2cc_serve._C",
    sorted(glob.glob("csrc/*.cc") + glob.glob("csrc/sched/*.cc")),
    include_dirs=["csrc"],
    # A header edit alone rebuilds too (else objects built against an old struct layout mix).
    depends=sorted(glob.glob("csrc/*.h") + glob.glob("csrc/sched/*.h")),
    cxx_std=17,
    extra_compile_args=["-O3", f"-march={MARCH}", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    extra_link_args=["-pthread"],
)

PINS = runpy.run_path("r2cc_serve/pins.py")
setup(ext_modules=[ext],
      install_requires=[f"torch=={PINS['TORCH_VERSION']}", "numpy", "pyyaml", "fastapi", "uvicorn",
                        "prometheus_client", "httpx"])
