"""A non-editable install carries what the package needs: the wheel `pip wheel .` builds holds
every file under r2cc_serve/ that git tracks (Python or not: the type stub, the PEP 561 marker,
the lab's C source), the C++ core, the licence and the entry points vLLM finds the plugin by."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Slow: the wheel build compiles the C++ core, and a fresh clone (CI's, after setup.sh's editable
# install, which leaves no build/) has nothing to reuse: 66 s on the shared 2-core box, 1 s where
# build/ already holds the core (`setup.py build_ext --inplace`).
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, ".git")) or shutil.which("git") is None,
                                 reason="needs the project's git checkout (the tracked files are the list)")]


def _tracked_package_files(folder: str) -> list[str]:
    """The files git tracks under folder, named as in a wheel (relative to the package's parent)."""
    out = subprocess.run(["git", "ls-files", folder], cwd=ROOT, capture_output=True, text=True, check=True)
    parent = os.path.dirname(folder)
    return [os.path.relpath(p, parent) if parent else p for p in out.stdout.splitlines() if p]


def _build_wheel(out, source: str, name: str):
    t0 = time.monotonic()
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "--disable-pip-version-check", "-q", "-w", str(out), source],
                           cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    print(f"{name} wheel built in {time.monotonic() - t0:.0f} s")
    (path,) = out.glob(f"{name}-*.whl")
    with zipfile.ZipFile(path) as z:
        return z.namelist(), {n: z.read(n).decode() for n in z.namelist() if n.endswith(
            (".dist-info/METADATA", ".dist-info/entry_points.txt"))}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return _build_wheel(tmp_path_factory.mktemp("wheel"), ROOT, "r2cc_serve")


@pytest.fixture(scope="module")
def testbed_wheel(tmp_path_factory):
    return _build_wheel(tmp_path_factory.mktemp("testbed-wheel"), os.path.join(ROOT, "testbed"), "r2cc_testbed")


def test_every_tracked_file_of_the_package_is_in_the_wheel(wheel):
    names, _ = wheel
    tracked = _tracked_package_files("r2cc_serve")
    assert any(not p.endswith(".py") for p in tracked)  # the point: the non-Python ones
    missing = [p for p in tracked if p not in names]
    assert not missing, f"not in the wheel: {missing} (add them to [tool.setuptools.package-data] in pyproject.toml)"
    for needed in ("r2cc_serve/_C.pyi", "r2cc_serve/py.typed"):
        assert needed in names
    # What serves, alone: a serving host does not get the test bed.
    assert not [n for n in names if n.startswith("r2cc_testbed/")], "the runtime's wheel holds the test bed"


def test_the_test_bed_is_a_wheel_of_its_own_with_every_file(testbed_wheel):
    names, meta = testbed_wheel
    tracked = [p for p in _tracked_package_files("testbed/r2cc_testbed")]
    missing = [p for p in tracked if p not in names]
    assert not missing, f"not in the test bed's wheel: {missing} (testbed/pyproject.toml's package-data)"
    assert "r2cc_testbed/lab/mptcp_reuseaddr_fix.c" in names
    assert not [n for n in names if n.startswith("r2cc_serve/")]
    metadata = next(v for k, v in meta.items() if k.endswith("METADATA"))
    assert "Requires-Dist: r2cc-serve" in metadata and "License-Expression: Apache-2.0" in metadata


def test_the_wheel_holds_the_core_the_licence_and_the_plugin_entry_points(wheel):
    names, meta = wheel
    assert [n for n in names if n.startswith("r2cc_serve/_C.") and n.endswith(".so")], "no C++ core"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "no LICENSE"
    metadata = next(v for k, v in meta.items() if k.endswith("METADATA"))
    assert "License-Expression: Apache-2.0" in metadata
    entry_points = next(v for k, v in meta.items() if k.endswith("entry_points.txt"))
    assert "[vllm.general_plugins]" in entry_points and "r2cc = r2cc_serve.vllm.plugin:register" in entry_points
    assert "[console_scripts]" in entry_points and "r2cc = r2cc_serve.cli:main" in entry_points
