"""patches/: each .patch still applies cleanly to the installed vLLM, and the README keeps up.

The patches are the upstreamable form of r2cc's run-time changes to vLLM (see patches/README.md);
nothing applies them for real, so this is what keeps them from rotting. vLLM is never imported
(that takes seconds): the files a patch touches are found with importlib and copied to tmp_path.
"""

from __future__ import annotations

import importlib.util
import py_compile
import re
import shutil
from pathlib import Path

import pytest

from r2cc_serve.vllm import compat as vllm_compat
from r2cc_serve.pins import VLLM_VERSION
from tests.conftest import why_missing

PATCHES = Path(__file__).resolve().parents[2] / "patches"
README = PATCHES / "README.md"
PATCH_FILES = sorted(PATCHES.glob("*.patch"))


def _load_refresh():
    spec = importlib.util.spec_from_file_location("r2cc_patches_refresh", PATCHES / "refresh.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


refresh = _load_refresh()


def _why_skip() -> str | None:
    if refresh.vllm_root() is None:
        return why_missing("vllm") or "vLLM is not installed; run scripts/install_vllm.sh"
    found = vllm_compat.installed_vllm_version()
    if found != VLLM_VERSION:
        return f"vLLM {found} is installed but the patches are checked against the pinned {VLLM_VERSION}"
    return None


needs_vllm = pytest.mark.skipif(_why_skip() is not None, reason=_why_skip() or "")


def test_there_are_patches():
    assert PATCH_FILES, f"no *.patch in {PATCHES}"


def test_readme_table_lists_exactly_the_patches():
    rows = [line for line in README.read_text().splitlines() if line.startswith("|")]
    named = {name for row in rows for name in re.findall(r"[\w.-]+\.patch\b", row)}
    present = {p.name for p in PATCH_FILES}
    assert not present - named, f"patches/README.md does not describe {sorted(present - named)}: add a table row"
    assert not named - present, f"patches/README.md names {sorted(named - present)}, which patches/ does not have"


def test_readme_names_the_pinned_vllm():
    m = re.search(r"made against \*\*vLLM ([^*]+)\*\*", README.read_text())
    assert m, "patches/README.md must say which vLLM the patches are made against (\"made against **vLLM X**\")"
    assert m.group(1) == VLLM_VERSION, (
        f"patches/README.md says the patches are made against vLLM {m.group(1)}, but r2cc_serve/pins.py pins "
        f"{VLLM_VERSION}: re-check every patch against the new vLLM (README: 'Regenerating'), then update it")


def test_each_patch_explains_itself_and_patches_touch_disjoint_files():
    owner: dict[str, str] = {}
    for patch in PATCH_FILES:
        header, body = refresh.split(patch.read_text())
        assert "Stands in for" in header, f"{patch.name}: its header needs a 'Stands in for' line"
        for f in refresh.touched_files(body):
            assert f.startswith("vllm/"), f"{patch.name}: {f} is not a path inside the vllm package"
            assert f not in owner, f"{f} is changed by {owner[f]} and {patch.name}: keep each file in one patch"
            owner[f] = patch.name


def _git_apply(patch: Path, where: Path, *extra: str) -> str:
    run = refresh.git_apply(patch, where, "--whitespace=error", *extra)
    out = (run.stdout + run.stderr).strip()
    assert run.returncode == 0, f"{patch.name} does not apply to vLLM {VLLM_VERSION}:\n{out}"
    loose = [line for line in out.splitlines() if re.search(r"offset|fuzz|warning|\.rej", line, re.I)]
    assert not loose, f"{patch.name} applies only loosely (context moved): regenerate it:\n" + "\n".join(loose)
    return out


@needs_vllm
@pytest.mark.parametrize("patch", PATCH_FILES, ids=lambda p: p.stem)
def test_patch_applies_cleanly_and_compiles(patch: Path, tmp_path: Path):
    assert shutil.which("git") and shutil.which("diff"), "needs git and diff: apt-get install git diffutils"
    text = patch.read_text()
    header, body = refresh.split(text)
    files = refresh.touched_files(body)
    root = refresh.vllm_root()
    missing = [f for f in files if not (root / f).is_file()]
    assert not missing, f"{patch.name} changes files this vLLM does not have: {missing}"
    pristine, patched = tmp_path / "a", tmp_path / "b"
    refresh.copy_pristine(files, root, pristine)
    refresh.copy_pristine(files, root, patched)

    _git_apply(patch, patched, "--check")
    _git_apply(patch, patched)

    for f in files:
        assert (patched / f).read_bytes() != (pristine / f).read_bytes(), f"{patch.name} left {f} unchanged"
        if f.endswith(".py"):
            py_compile.compile(str(patched / f), cfile=str(tmp_path / "compiled.pyc"), doraise=True)
    assert refresh.render(header, pristine, patched, files) == text, (
        f"{patch.name} applies, but not in the form `python3 patches/refresh.py write {patch.stem}` writes "
        "(diff -u, a/ b/ labels, def/class in hunk headers): regenerate it with refresh.py")
