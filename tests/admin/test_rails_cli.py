"""`r2cc rails ACTION HOST:RAIL` against the real admin API (`r2cc admin`, its own process) over a
real 2-rank group on loopback rails: a drain and an undrain change what the view shows, and each
way an action can go wrong is one line and a nonzero exit, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import httpx
import pytest

from r2cc_serve import cli
from tests.admin.servers import admin_server, wait_for
from tests.comm import workers
from tests.comm.harness import free_port, run_ranks, store_barrier

TOKEN = "rails-cli-token-5c1e"
TOKEN_VARS = ("R2CC_ADMIN_TOKEN", "R2CC_ADMIN_TOKEN_FILE", "R2CC_ADMIN_READ_TOKEN")


def idle_until_stopped(rank, world, store, status_dir, stop_file):
    """One all_reduce (the rails come up), then nothing until stop_file appears: actions need live
    ranks, not traffic, and this box's two cores are shared."""
    import torch

    os.environ["R2CC_STATUS_DIR"] = status_dir
    comm = workers.open_comm(rank, world, store, group="cli")
    try:
        comm.all_reduce(torch.ones(1 << 10))
        while not os.path.exists(stop_file):
            time.sleep(0.05)
        store_barrier(store, "stop", rank, world)
        return True
    finally:
        comm.close()


def _states(base: str) -> dict:
    rails = httpx.get(base + "/r2cc/v1/rails", timeout=5).json()["rails"]
    return {(r["host"], r["rail"]): r["state"] for r in rails}


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """The base URL of `r2cc admin` over an idle group whose six rails (rank0, rank1: 0..2) are up."""
    tmp = tmp_path_factory.mktemp("rails-cli")
    status_dir, stop_file = str(tmp / "status"), str(tmp / "stop")
    os.makedirs(status_dir)
    result = {}
    group = threading.Thread(target=lambda: result.update(
        res=run_ranks(idle_until_stopped, 2, status_dir, stop_file, timeout=180)))
    group.start()
    try:
        wait_for(lambda: len(os.listdir(status_dir)) == 2, "both ranks' status files", 60)
        with admin_server(status_dir, TOKEN, tmp / "admin.log") as base:
            wait_for(lambda: len(s := _states(base)) == 6 and set(s.values()) == {"up"}, "every rail up")
            yield base
    finally:
        open(stop_file, "w").close()
        group.join(timeout=200)
    assert result.get("res") == [True, True], "the group did not finish"


def _r2cc(*args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess:
    """The real `r2cc` command in its own process, with only `token` as R2CC_ADMIN_TOKEN."""
    env = {k: v for k, v in os.environ.items() if k not in TOKEN_VARS} | ({"R2CC_ADMIN_TOKEN": token} if token else {})
    return subprocess.run([sys.executable, "-m", "r2cc_serve.cli", *args], capture_output=True, text=True,
                          timeout=60, env=env)


def test_drain_then_undrain_from_the_command_line(api):
    out = _r2cc("rails", "drain", "h0:1", "--reason", "swap cable, ticket 42", "--url", api)
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith("drain rank0 rail1 (h0:1): done on rank 0; state now drain"), out.stdout
    assert "swap cable, ticket 42" in out.stdout  # the decision, shown under the rail's row
    wait_for(lambda: (s := _states(api))[("rank0", 1)] == s[("rank1", 1)] == "drained", "rail 1 drained at both ends")

    # --url before the action, the host by name: the same rail back in service
    out = _r2cc("rails", "--url", api, "undrain", "rank0:1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("undrain rank0 rail1 (rank0:1): done on rank 0; state now up"), out.stdout
    wait_for(lambda: set(_states(api).values()) == {"up"}, "every rail up again")
    assert _r2cc("rails", "--url", api).returncode == 0  # the table as before


def _main(capsys, monkeypatch, *argv: str, token: str | None = TOKEN) -> str:
    """`r2cc rails ...` in this process; its one-line error (it must fail, and say it in one line)."""
    for name in TOKEN_VARS:
        monkeypatch.delenv(name, raising=False)
    if token:
        monkeypatch.setenv("R2CC_ADMIN_TOKEN", token)
    code = cli.main(["rails", *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("r2cc: error: "), (code, err)
    return err


@pytest.mark.parametrize("argv, token, says", [
    (["drain", "h9:1"], TOKEN, "h9:1: no host h9: the view has 2 hosts, h0 rank0, h1 rank1"),
    (["failover", "h1:7"], TOKEN, "h1:7: rank1 has no rail 7; its rails are 0, 1, 2"),
    (["drain", "h0/1"], TOKEN, "'h0/1' is not a rail: give h<HOST>:<RAIL> or HOSTNAME:<RAIL>, e.g. h1:2"),
    (["drain", "h0:1"], None, "r2cc rails drain needs the admin token: set R2CC_ADMIN_TOKEN"),
    (["drain", "h0:1", "--token", "wrong"], None, "refused the token (401): set R2CC_ADMIN_TOKEN"),
    (["drain", "h0:1", "--reason", "two\nlines"], TOKEN, "--reason must be plain text on one line"),
])
def test_a_bad_target_or_token_is_one_line(api, capsys, monkeypatch, argv, token, says):
    assert says in _main(capsys, monkeypatch, *argv, "--url", api, token=token)
    assert set(_states(api).values()) == {"up"}  # nothing was changed


def test_an_api_that_does_not_answer_names_the_url_and_how_to_point_elsewhere(capsys, monkeypatch):
    url = f"http://127.0.0.1:{free_port()}"
    err = _main(capsys, monkeypatch, "undrain", "h0:1", "--url", url)
    assert f"cannot reach the admin API at {url}" in err and "--url" in err, err


def test_a_refused_action_says_why_and_how_to_insist(api, capsys, monkeypatch):
    """The last healthy rail of a host: 409 from the API, in the command's words (--force)."""
    monkeypatch.setenv("R2CC_ADMIN_TOKEN", TOKEN)
    for rail in (0, 1):
        assert cli.main(["rails", "--url", api, "drain", f"h1:{rail}"]) == 0
    try:
        err = _main(capsys, monkeypatch, "failover", "h1:2", "--url", api)
        assert "failover rank1 rail2 not done: HTTP 409" in err and "last healthy rail" in err, err
        assert "(here: --force)" in err, err
    finally:
        for rail in (0, 1):
            assert cli.main(["rails", "--url", api, "undrain", f"h1:{rail}"]) == 0
    wait_for(lambda: set(_states(api).values()) == {"up"}, "every rail up again")
