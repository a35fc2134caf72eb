"""A serving host installs r2cc-serve alone: the test bed's subcommands then say how to get it,
in one line, exit 2, and the runtime's own subcommands work as before."""

from __future__ import annotations

import pytest

from r2cc_serve import cli


@pytest.fixture
def no_testbed(monkeypatch):
    monkeypatch.setattr(cli, "_TESTBED", "r2cc_testbed_is_not_installed_here")


@pytest.mark.parametrize("argv", [["lab", "up", "--hosts", "2"], ["bench", "--no-lab"], ["demo"], ["loadtest", "x.yaml"]])
def test_a_test_bed_command_says_how_to_get_it(no_testbed, capsys, argv):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"r2cc {argv[0]}: part of r2cc's test bed" in err and "pip install ./testbed" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_the_runtime_commands_stay_and_the_help_names_the_rest(no_testbed, capsys):
    parser = cli.build_parser()
    assert parser.parse_args(["knobs"]).func is not None
    parser.print_help()
    out = capsys.readouterr()
    assert "doctor" in out.out and "needs the test bed" in out.out
    assert "unavailable" not in out.err  # nothing missing is reported as broken


def test_with_the_test_bed_its_commands_are_the_real_ones():
    parser = cli.build_parser()
    args = parser.parse_args(["lab", "status"])
    assert args.func.__module__.startswith("r2cc_testbed."), args.func
