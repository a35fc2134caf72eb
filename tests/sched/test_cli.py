"""`r2cc sim`: table, JSON, plot, and clear errors instead of tracebacks."""

import json

import pytest

from r2cc_serve import cli


def _run(capsys, *argv):
    code = cli.main(["sim", "--quiet", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_sim_prints_a_table_and_writes_json(capsys, tmp_path):
    path = tmp_path / "out.json"
    code, out, err = _run(capsys, "--p", "4,16", "--beta", "0.5,0.75", "--degraded", "1,2,8",
                          "--sizes", "1M,64M", "--schedules", "direct,ring,r2ccl,optcc", "--json", str(path))
    assert code == 0, err
    assert "T_LB" in out and "optcc" in out and "skipped" in out  # degraded 8 >= p 4
    data = json.loads(path.read_text())
    rows = data["results"]
    assert len(rows) == 2 * 2 * 3 * 2 - 4  # p=4 with 8 degraded skipped
    for row in rows:
        assert row["schedules"]["direct"]["seconds"] == pytest.approx(row["ring_closed_form_s"], rel=1e-4)
        assert row["schedules"]["optcc"]["seconds"] >= row["lower_bound_s"] * (1 - 1e-9)
        if row["p"] >= 16 and row["degraded"] == 1 and row["bytes"] == 64 << 20:
            assert row["schedules"]["optcc"]["vs_lower_bound"] <= 1.02


def test_sim_plot(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "out.png"
    code, out, err = _run(capsys, "--p", "4,8", "--beta", "0.5", "--plot", str(png))
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv,msg", [
    (["--p", "1"], "--p"),
    (["--p", "4,x"], "--p"),
    (["--beta", "1.5"], "--beta"),
    (["--beta", "0"], "--beta"),
    (["--sizes", "12Q"], "--sizes"),
    (["--schedules", "tree"], "--schedules"),
    (["--degraded", "4", "--p", "4"], "healthy"),
    (["--chunks", "0"], "--chunks"),
    (["--alpha-us", "-1"], "alpha"),
    (["--json", "/nonexistent/dir/x.json", "--p", "4"], "cannot write"),
])
def test_bad_input_is_a_clear_error(capsys, argv, msg):
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert msg in err and "Traceback" not in err


def test_size_parser():
    from r2cc_serve.sched.cli import parse_size
    assert parse_size("1M") == 1 << 20 and parse_size("64MiB") == 64 << 20 and parse_size("4k") == 4096
    assert parse_size("100") == 100
