#!/usr/bin/env bash
# One-shot, idempotent set-up of everything r2cc-serve needs on a fresh Debian
# machine (run as root): system tools for the fault lab and the Open MPI peer,
# the Python package with its C++ core, test tools, and (unless R2CC_SKIP_VLLM=1)
# vLLM for CPU.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
  echo "setup.sh: run as root (it installs Debian packages; the fault lab needs root too)" >&2
  exit 2
fi

# mptcpize: the MPTCP baselines (gloo-mptcp, default-mptcp) run under its preload library.
# prometheus: its promtool checks the alert rules, and its server scrapes a live deployment in
# the tests (installed without its recommended exporters; no service is started here).
APT_PKGS=(iproute2 nftables procps openmpi-bin libopenmpi-dev g++ make mptcpize)
APT_PKGS_NO_RECOMMENDS=(prometheus)
# The emulated RDMA guest (`r2cc lab guest`, tests marked rdma): qemu boots Debian's 6.1 kernel with
# Soft-RoCE, busybox-static makes its initramfs, kmod indexes its modules; the verbs user space
# (rdma-core, ibverbs-*, pyverbs) runs in it from the host's root. Same list as
# testbed/r2cc_testbed/guest/apt.py; the guest's kernel is fetched by `r2cc lab guest build` (cached).
APT_PKGS_GUEST=(qemu-system-x86 busybox-static rdma-core ibverbs-utils ibverbs-providers python3-pyverbs kmod
                libibverbs-dev)
apt_install() {  # apt_install [--no-install-recommends] PKG...: those not yet installed
  local opts=() missing=()
  [ "$1" = --no-install-recommends ] && { opts=("$1"); shift; }
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  step "apt: installing ${missing[*]}"
  [ -n "${APT_UPDATED:-}" ] || { apt-get update -qq; APT_UPDATED=1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${opts[@]}" "${missing[@]}" >/dev/null
}
apt_install "${APT_PKGS[@]}"
apt_install --no-install-recommends "${APT_PKGS_NO_RECOMMENDS[@]}" "${APT_PKGS_GUEST[@]}"

PY=${PYTHON:-python3}
source scripts/pip_quiet.sh
pip_install() { pip_quiet "$PY" -m pip install -q --disable-pip-version-check "$@"; }
source scripts/pins.sh  # TORCH_VERSION, VLLM_VERSION
step "pip: torch $TORCH_VERSION (CPU), build and test tools"
pip_install "torch==$TORCH_VERSION" "pybind11>=2.12" "setuptools>=77" wheel \
  pytest pytest-timeout "schemathesis>=4" mpi4py

step "pip: r2cc-serve (editable) and its C++ core, and its test bed r2cc-testbed"
pip_install --no-build-isolation -e ".[test,bench]" -e ./testbed
$PY -c "import r2cc_serve._C" || { echo "setup.sh: the C++ core did not build" >&2; exit 1; }

if [ "${R2CC_SKIP_VLLM:-0}" != 1 ] && [ -f scripts/install_vllm.sh ]; then
  step "vLLM for CPU"
  bash scripts/install_vllm.sh
fi
step "set-up done: try \`r2cc lab up --hosts 2 --rails 4\` or \`python -m pytest -q\`"
