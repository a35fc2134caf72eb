# Sourced by setup.sh and install_vllm.sh: how this project runs pip.
# We are root on purpose (the fault lab needs it). As a flag, --root-user-action is an install
# option only and pip 23 rejects it before the subcommand, so it goes through the environment.
export PIP_ROOT_USER_ACTION=ignore

# Run a pip command without this machine's noise about the local find-links index not holding
# a package; with pipefail set by the caller, pip's own exit status is kept.
pip_quiet() {
  "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}
