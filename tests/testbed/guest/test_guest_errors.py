"""The guest's errors a user can fix are one line (GuestError, a UserError), and a guest that stops
answering is killed at its deadline (a fake qemu: no VM here)."""

from __future__ import annotations

import os
import re
import sys
import textwrap

import pytest

from r2cc_serve import cli
from r2cc_serve.errors import UserError
from r2cc_testbed.guest import apt, builder, runner

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_not_root_says_what_to_do(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(apt.GuestError, match="needs root") as exc:
        builder.build()
    assert isinstance(exc.value, UserError) and "\n" not in str(exc.value)


def test_no_qemu_says_how_to_get_it(monkeypatch):
    monkeypatch.setattr(apt.shutil, "which", lambda name: None)
    with pytest.raises(apt.GuestError, match=r"qemu-system-x86_64 is missing: run `r2cc lab guest build`"):
        apt.require_qemu()


def test_an_apt_failure_is_one_line_with_apt_s_last_word():
    with pytest.raises(apt.GuestError) as exc:
        apt._apt(["sh", "-c", "echo noise >&2; echo 'E: Unable to locate package x' >&2; exit 100"], "installing x")
    assert str(exc.value).startswith("installing x: `sh -c") and str(exc.value).endswith("E: Unable to locate package x")
    with pytest.raises(apt.GuestError, match="`no-such-apt-get` is missing"):
        apt._apt(["no-such-apt-get"], "installing x")


def test_the_cli_prints_a_guest_error_as_one_line_with_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cli.main(["lab", "guest", "build"]) == 2
    err = capsys.readouterr().err.strip()
    assert "needs root" in err and len(err.splitlines()) == 1
    assert cli.main(["lab", "guest", "run", "--rails", "99", "--", "true"]) == 2
    assert cli.main(["lab", "guest", "run"]) == 2
    assert "give a command after --" in capsys.readouterr().err


def test_setup_sh_installs_every_package_the_guest_needs():
    with open(os.path.join(ROOT, "scripts", "setup.sh")) as f:
        listed = re.search(r"APT_PKGS_GUEST=\(([^)]*)\)", f.read()).group(1).split()
    assert sorted(listed) == sorted(apt.PACKAGES)


def _fake_qemu(script: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(script)]


def test_a_guest_silent_past_a_deadline_is_killed_and_reported():
    console = runner._Console(_fake_qemu("""
        import time
        print("r2cc-guest: command start", flush=True)
        time.sleep(60)
    """), on_line=None)
    try:
        problem = console.follow(boot_s=10, command_s=0.5, poweroff_s=10)
    finally:
        console.kill()
    assert problem == "hung: the command did not end within 0.5 s; killed"
    assert console.proc.poll() is not None and console.span("command start", "exit") < 10


def test_a_guest_that_finishes_reports_its_phases():
    lines = []
    console = runner._Console(_fake_qemu("""
        print("\\x1b[2Jboot noise\\r", flush=True)
        print("Booting from ROM..r2cc-guest: up uptime=4.0", flush=True)
        print("r2cc-guest: command start", flush=True)
        print("r2cc-guest: command end rc=0", flush=True)
    """), on_line=lines.append)
    try:
        assert console.follow(boot_s=10, command_s=10, poweroff_s=10) is None
    finally:
        console.kill()
    assert lines[0] == "boot noise"  # terminal escapes and carriage returns removed
    assert 0 <= console.span("start", "up") <= console.span("start", "command start")
    assert console.span("command start", "command end") >= 0
