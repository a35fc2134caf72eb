"""Builds the C++ core r2cc_serve._C; the torch pin comes from r2cc_serve/pins.py (other
metadata lives in pyproject.toml)."""

import glob
import runpy

from pybind11.setup_helpers import Pybind11Extension
from setuptools import setup

ext = Pybind11Extension(
    "r2cc_serve._C",
    sorted(glob.glob("csrc/*.cc") + glob.glob("csrc/sched/*.cc")),
    include_dirs=["csrc"],
    # A header edit alone rebuilds too (else objects built against an old struct layout mix).
    depends=sorted(glob.glob("csrc/*.h") + glob.glob("csrc/sched/*.h")),
    cxx_std=17,
    # Built on the machine that runs it, so native vector units (AVX2/AVX-512) are safe.
    extra_compile_args=["-O3", "-march=native", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    extra_link_args=["-pthread"],
)

PINS = runpy.run_path("r2cc_serve/pins.py")
setup(ext_modules=[ext],
      install_requires=[f"torch=={PINS['TORCH_VERSION']}", "numpy", "pyyaml", "fastapi", "uvicorn",
                        "prometheus_client", "httpx"])
