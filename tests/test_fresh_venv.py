"""A real install: docs/deploy.md's install lines in a fresh virtual environment (no system
packages, not editable), then `r2cc --version` and `r2cc demo` from it, run from outside the
checkout so nothing of the source tree is imported.

Slow (-m slow): vLLM's CPU build and torch are installed into the new environment (153 s from the
package mirror on the shared 2-core box) and the C++ core is compiled (65 s), then the demo runs
(about 3 minutes). Needs root for the demo's lab. Run:
    python3 -m pytest -q -m slow tests/test_fresh_venv.py -s"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY_DOC = os.path.join(ROOT, "docs", "deploy.md")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400),
              pytest.mark.skipif(os.geteuid() != 0, reason="the demo's lab needs root")]


def _install_lines() -> list[str]:
    """The commands of deploy.md's install block (section 1), one a line, comments dropped."""
    text = open(DEPLOY_DOC).read()
    m = re.search(r"## 1\. Install.*?```bash\n(.*?)\n```", text, re.S)
    assert m, "docs/deploy.md lost its install block (section 1)"
    return [line.split("#", 1)[0].strip() for line in m.group(1).splitlines() if line.split("#", 1)[0].strip()]


def test_install_block_names_the_venv_the_test_replaces():
    lines = _install_lines()
    assert lines[0] == "python3 -m venv /opt/r2cc", lines
    assert any(line.endswith("pip install .") for line in lines), lines


def _run(cmd: str, cwd: str, env: dict, timeout: float) -> tuple[str, float]:
    t0 = time.monotonic()
    p = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - t0
    assert p.returncode == 0, f"`{cmd}` failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout + p.stderr, took


def test_fresh_venv_install_then_demo(tmp_path):
    venv = str(tmp_path / "r2cc")
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:" + os.path.dirname(sys.executable),
           "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8", "TMPDIR": str(tmp_path)}
    # The doc's lines with its venv's path swapped for a temporary one, run from the checkout.
    times, version = {}, ""
    for line in _install_lines():
        cmd = line.replace("/opt/r2cc", venv).replace("python3 -m venv", f"{sys.executable} -m venv")
        if cmd.startswith("export PATH="):
            env["PATH"] = f"{venv}/bin:" + env["PATH"]
            continue
        if cmd.endswith("pip install ./testbed"):
            # The runtime alone, as on a serving host: the test bed's commands say how to get it.
            p = subprocess.run([f"{venv}/bin/r2cc", "demo"], cwd="/", env=env, capture_output=True, text=True,
                               timeout=120)
            assert p.returncode == 2 and "pip install ./testbed" in p.stderr, p.stdout + p.stderr
            assert "Traceback" not in p.stderr, p.stderr
        out, times[cmd] = _run(cmd, ROOT, env, 1800)
        if cmd == "r2cc --version":
            version = out
    print("install: " + "; ".join(f"{c.split()[0]}..{c.split()[-1]} {t:.0f} s" for c, t in times.items()))
    assert "r2cc-serve" in version and "wire protocol" in version, version
    where, _ = _run(f"{venv}/bin/python -c 'import r2cc_serve; print(r2cc_serve.__file__)'", "/", env, 60)
    assert where.strip().startswith(venv + "/lib/"), where  # the installed copy, not the checkout
    demo, took = _run(f"{venv}/bin/r2cc demo", "/", env, 1500)
    print(f"r2cc demo from the fresh venv: {took:.0f} s")
    assert re.search(r"requests\s*: (\d+)/\1 ok, 0 failed", demo), demo[-3000:]
    assert re.search(r"outputs\s*: identical to the fault-free reference: yes", demo), demo[-3000:]
    assert re.search(r"verdict\s*: lossless failover", demo), demo[-3000:]
