"""`r2cc doctor`'s input errors: one line on stderr, exit 2, never a traceback, and no wait."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from r2cc_serve import cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def no_rail_env(monkeypatch):
    # Restored afterwards even though --config sets R2CC_CONFIG for the rest of the process.
    for name in ("R2CC_RAILS", "R2CC_CONFIG", "R2CC_NETNS"):
        monkeypatch.delenv(name, raising=False)


def doctor(capsys, *args: str) -> tuple[int, str]:
    code = cli.main(["doctor", *args])
    err = capsys.readouterr().err.strip()
    return code, err


@pytest.mark.parametrize("args, words", [
    (["--rails", "nosuchnic0", "--peer", "10.0.0.2"], "rail 0 (nosuchnic0): no such interface on this host"),
    (["--rails", "192.0.2.222", "--peer", "10.0.0.2"], "rail 0 (192.0.2.222): no interface on this host has that address"),
    (["--rails", "lo", "--peer", "10.0.0.x"], "'10.0.0.x' is not an IPv4 address"),
    (["--rails", "lo", "--peer", "peer-b"], "'peer-b' is not an IPv4 address"),
    (["--rails", "lo", "--peer", "10.0.0.2,10.0.1.2"], "has 2 address(es) but this host has 1 rail(s)"),
    (["--rails", "lo"], "name the peers: --peer ADDR,ADDR,..."),
    (["--peer", "10.0.0.2"], "name this host's rails: --rails"),
    (["--rails", ",", "--peer", "10.0.0.2"], "--rails names no rail"),
    (["--rails", "lo", "--peer", "10.0.0.2", "--port", "0"], "--port 0: use 1-65535"),
    (["--rails", "lo", "--peer", "10.0.0.2", "--bandwidth-seconds", "60"], "--bandwidth-seconds 60"),
    (["--lab", "--rails", "lo"], "--lab takes the lab's own rails and hosts"),
    (["--serve", "--rails", "lo", "--peer", "127.0.0.2"], "--serve answers checks"),
    (["--config", "/nonexistent/rails.yaml", "--peer", "10.0.0.2"], "--config /nonexistent/rails.yaml: no such file"),
    (["--rails", "lo", "--peers", "/nonexistent/peers"], "--peers /nonexistent/peers: cannot read it"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, args, words):
    code, err = doctor(capsys, *args)
    assert code == 2 and words in err, err
    assert len(err.splitlines()) == 1 and err.startswith("r2cc: error: ")


def test_peers_file_lines_are_checked(capsys, tmp_path):
    peers = tmp_path / "peers"
    peers.write_text("# name and rail addresses\nnode-b 127.0.0.9\nnode-c 127.0.0.10 extra\n")
    code, err = doctor(capsys, "--rails", "lo", "--peers", str(peers))
    assert code == 2 and f"--peers {peers}:3: expected `[NAME] ADDR,ADDR,...`" in err


def test_a_rail_map_file_is_read_as_the_communicator_reads_it(capsys, tmp_path):
    cfg = tmp_path / "rails.yaml"
    cfg.write_text("rails: [nosuchnic0, nosuchnic1]\n")
    code, err = doctor(capsys, "--config", str(cfg), "--peer", "10.0.0.2,10.0.1.2")
    assert code == 2 and "rail 0 (nosuchnic0): no such interface" in err
    cfg.write_text("rails: [lo]\nwires: 3\n")
    code, err = doctor(capsys, "--config", str(cfg), "--peer", "10.0.0.2")
    assert code == 2 and "unknown keys ['wires']" in err


@pytest.mark.parametrize("entry", [["r2cc_serve.cli", "doctor"], ["r2cc_serve.doctor"]])
def test_the_real_command_prints_no_traceback(entry):
    proc = subprocess.run([sys.executable, "-m", *entry, "--rails", "nosuchnic0", "--peer", "10.0.0.2"],
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("r2cc: error: rail 0 (nosuchnic0)") and "Traceback" not in proc.stderr
