# Sourced: VLLM_VERSION and TORCH_VERSION from r2cc_serve/pins.py, the one place they are written.
_pins_py="$(dirname "${BASH_SOURCE[0]}")/../r2cc_serve/pins.py"
eval "$("${PYTHON:-python3}" -c '
import runpy, sys
p = runpy.run_path(sys.argv[1])
print("VLLM_VERSION=%s TORCH_VERSION=%s" % (p["VLLM_VERSION"], p["TORCH_VERSION"]))' "$_pins_py")"
