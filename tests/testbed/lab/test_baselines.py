"""The gloo baselines' wiring (lab/baselines.py) and the MPTCP preload fix (lab/mptcp.py).

The fix is checked against the real kernel on loopback: an accepted MPTCP socket refuses
SO_REUSEADDR, and only that refusal is turned into success.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest

from r2cc_serve.errors import UserError
from r2cc_testbed.lab import baselines, mptcp

RAILS = ["rail0", "rail1", "rail2", "rail3"]


def test_names_and_variants():
    assert baselines.names("gloo") == ("gloo", "gloo-rails", "gloo-mptcp")
    assert baselines.names("default") == ("default", "default-rails", "default-mptcp")
    assert [baselines.variant_of(n, "default") for n in ("default", "default-rails", "default-mptcp")] == \
        ["one", "rails", "mptcp"]
    assert baselines.variant_of("r2cc", "default") is None
    assert baselines.variant_of("gloo-mptcp", "default") is None


def test_one_rail_is_what_a_user_configures_and_rails_is_a_device_each():
    assert baselines.gloo_env("one", RAILS) == {"GLOO_SOCKET_IFNAME": "rail0"}
    assert baselines.gloo_env("rails", RAILS) == {"GLOO_SOCKET_IFNAME": "rail0,rail1,rail2,rail3"}
    with pytest.raises(UserError):
        baselines.gloo_env("one", [])


class _Lab:
    mptcp = False


def test_mptcp_refuses_a_lab_without_endpoints():
    with pytest.raises(UserError, match="no MPTCP endpoints"):
        baselines.gloo_env("mptcp", RAILS, _Lab())


@pytest.mark.requires("mptcp")
def test_mptcp_preloads_mptcpize_then_the_fix_and_keeps_the_callers_preload(tmp_path):
    env = baselines.gloo_env("mptcp", RAILS, base={"LD_PRELOAD": "/opt/other.so"})
    libs = env["LD_PRELOAD"].split()
    assert env["GLOO_SOCKET_IFNAME"] == "rail0"
    assert "libmptcpwrap" in libs[0] and "mptcp_reuseaddr_fix" in libs[1] and libs[2] == "/opt/other.so"
    assert os.path.exists(libs[1])


@pytest.mark.requires("mptcp")
def test_the_fix_is_rebuilt_into_a_fresh_cache(tmp_path):
    path = mptcp.reuseaddr_fix(str(tmp_path))
    assert path.startswith(str(tmp_path)) and os.path.getsize(path) > 0
    assert mptcp.reuseaddr_fix(str(tmp_path)) == path  # built once


# Run in a child so the preload applies: accept an MPTCP connection on loopback, then set
# SO_REUSEADDR on the accepted socket (what gloo does), and give a plain TCP socket a bad
# option length (an EINVAL that must stay an error).
_PROBE = textwrap.dedent("""
    import errno, socket, sys
    IPPROTO_MPTCP = 262
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_MPTCP)
    srv.bind(("127.0.0.1", 0)); srv.listen(1)
    cli = socket.socket(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_MPTCP)
    cli.connect(srv.getsockname())
    conn, _ = srv.accept()
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        accepted = "ok"
    except OSError as exc:
        accepted = errno.errorcode[exc.errno]
    tcp = socket.socket()
    try:
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, b"x")
        bad = "ok"
    except OSError as exc:
        bad = errno.errorcode[exc.errno]
    print(accepted, bad)
""")


def _probe(preload: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if preload:
        env["LD_PRELOAD"] = preload
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.requires("mptcp")
def test_the_fix_turns_only_the_mptcp_reuseaddr_refusal_into_success():
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262).close()
    except OSError:
        pytest.skip("MPTCP sockets cannot be opened here")
    accepted, bad = _probe(None)
    if accepted == "ok":
        pytest.skip("this kernel accepts SO_REUSEADDR on accepted MPTCP sockets: the fix is not needed")
    assert (accepted, bad) == ("EINVAL", "EINVAL")
    assert _probe(mptcp.reuseaddr_fix()) == ["ok", "EINVAL"]
