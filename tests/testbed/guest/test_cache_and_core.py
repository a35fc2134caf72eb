"""The guest build's cache: content keys, freshness, and the portable core rebuilt only when its
sources change (the compiler is faked: no guest, no g++)."""

from __future__ import annotations

import os

import pytest

from r2cc_testbed.guest import cache, core
from r2cc_testbed.guest.apt import GuestError


@pytest.fixture(autouse=True)
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("R2CC_GUEST_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def checkout(tmp_path):
    root = tmp_path / "checkout"
    (root / "csrc" / "sched").mkdir(parents=True)
    (root / "csrc" / "a.cc").write_text("int a;\n")
    (root / "csrc" / "a.h").write_text("#pragma once\n")
    (root / "csrc" / "sched" / "b.cc").write_text("int b;\n")
    (root / "setup.py").write_text("# setup\n")
    (root / "README.md").write_text("not a source\n")
    return root


def test_digest_separates_its_parts_and_is_stable():
    assert cache.digest("ab", "c") != cache.digest("a", "bc")
    assert cache.digest("x", b"y") == cache.digest("x", "y")
    assert len(cache.digest("x")) == 16


def test_file_digest_follows_names_and_contents(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("1")
    b.write_text("1")
    first = cache.file_digest([str(a)], str(tmp_path))
    assert first != cache.file_digest([str(b)], str(tmp_path))  # same content, other name
    a.write_text("2")
    assert first != cache.file_digest([str(a)], str(tmp_path))


def test_a_directory_is_fresh_only_with_its_key_written_last(cache_root):
    path = cache.fresh_dir("thing", "k1")
    assert not cache.is_fresh(path, "k1")  # half-built: no key yet
    cache.mark_fresh(path, "k1")
    assert cache.is_fresh(path, "k1") and not cache.is_fresh(path, "k2")
    assert not cache.is_fresh(str(cache_root / "missing"), "k1")


def test_prune_keeps_the_current_and_the_most_recent_others(cache_root):
    for i, key in enumerate(["old", "mid", "new", "cur"]):
        path = cache.fresh_dir("core", key)
        os.utime(path, (1000 + i, 1000 + i))
    cache.prune("core", "cur", spare=1)
    assert sorted(os.listdir(cache_root)) == ["core-cur", "core-new"]


def test_core_sources_are_csrc_and_setup_py(checkout):
    names = {os.path.relpath(p, checkout) for p in core.sources(str(checkout))}
    assert names == {"csrc/a.cc", "csrc/a.h", "csrc/sched/b.cc", "setup.py"}


def test_core_key_changes_with_a_source_a_header_or_the_target_and_nothing_else(checkout):
    key = core.key(str(checkout))
    (checkout / "README.md").write_text("edited\n")
    assert core.key(str(checkout)) == key
    assert core.key(str(checkout), march="x86-64-v2") != key
    (checkout / "csrc" / "a.h").write_text("#pragma once // edited\n")
    assert core.key(str(checkout)) != key


@pytest.fixture
def fake_compiler(monkeypatch):
    """Replace setup.py build_ext by writing the .so where it would land; returns the build count."""
    builds = []

    def build(checkout, build_lib, build_temp, march, progress):
        builds.append(march)
        os.makedirs(os.path.join(build_lib, "r2cc_serve"), exist_ok=True)
        with open(os.path.join(build_lib, "r2cc_serve", core.so_name()), "w") as f:
            f.write("so")

    monkeypatch.setattr(core, "_build", build)
    return builds


def test_a_second_core_build_is_a_no_op_until_a_source_changes(checkout, fake_compiler):
    first = core.ensure(str(checkout), progress=lambda m: None)
    assert os.path.exists(first) and fake_compiler == [core.MARCH]
    assert core.ensure(str(checkout), progress=lambda m: None) == first
    assert len(fake_compiler) == 1
    (checkout / "csrc" / "sched" / "b.cc").write_text("int b = 1;\n")
    second = core.ensure(str(checkout), progress=lambda m: None)
    assert second != first and len(fake_compiler) == 2


def test_a_directory_without_csrc_is_refused_by_name(tmp_path):
    with pytest.raises(GuestError, match=f"{tmp_path} is not an r2cc-serve checkout"):
        core.check_checkout(str(tmp_path))


def test_the_guest_core_targets_what_tcg_runs():
    assert core.MARCH == "x86-64-v3"  # qemu 7.2 TCG `-cpu max`: AVX2 yes, AVX-512 no (a native build SIGILLs)
