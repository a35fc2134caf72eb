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


def _owners() -> dict[str, list[str]]:
    """vLLM file -> the patches that change it."""
    owners: dict[str, list[str]] = {}
    for patch in PATCH_FILES:
        for f in refresh.touched_files(refresh.split(patch.read_text())[1]):
            owners.setdefault(f, []).append(patch.name)
    return owners


def test_each_patch_explains_itself_and_shares_files_only_by_saying_so():
    for patch in PATCH_FILES:
        header, body = refresh.split(patch.read_text())
        assert "Stands in for" in header, f"{patch.name}: its header needs a 'Stands in for' line"
        for f in refresh.touched_files(body):
            assert f.startswith("vllm/"), f"{patch.name}: {f} is not a path inside the vllm package"
    for f, names in _owners().items():
        assert len(names) <= 2, f"{f} is changed by {names}: keep each file in one patch, two at most"
        if len(names) == 2:
            headers = [refresh.split((PATCHES / n).read_text())[0] for n in names]
            assert names[1] in headers[0] or names[0] in headers[1], (
                f"{f} is changed by {names[0]} and {names[1]}: one header must name the other (and the "
                "test below checks that they apply one after the other)")


@needs_vllm
def test_patches_that_share_a_file_apply_one_after_the_other_in_either_order(tmp_path: Path):
    pairs = {tuple(names) for names in _owners().values() if len(names) == 2}
    root = refresh.vllm_root()
    for first, second in [p for pair in pairs for p in (pair, pair[::-1])]:
        where = tmp_path / f"{first}+{second}"
        files = sorted({f for n in (first, second)
                        for f in refresh.touched_files(refresh.split((PATCHES / n).read_text())[1])})
        refresh.copy_pristine(files, root, where)
        for name in (first, second):
            run = refresh.git_apply(PATCHES / name, where)
            out = (run.stdout + run.stderr).strip()
            assert run.returncode == 0 and not re.search(r"fuzz|\.rej", out, re.I), (
                f"{name} does not apply after {first if name == second else 'nothing'}:\n{out}")
        for f in files:
            if f.endswith(".py"):
                py_compile.compile(str(where / f), cfile=str(tmp_path / "compiled.pyc"), doraise=True)


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
