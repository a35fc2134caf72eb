"""--out DIR, one meaning everywhere: the results folder, each file saying how it was made."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from r2cc_serve.errors import UserError
from r2cc_testbed.results import check_out, emit, write_result


def test_a_result_file_says_which_command_date_and_commit_made_it(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["r2cc", "serve-bench", "--rounds", "1", "--out", str(tmp_path / "r")])
    path = write_result(str(tmp_path / "r"), "serve-bench", {"backends": {"r2cc": {"tok_s": 300}}})
    assert path == str(tmp_path / "r" / "serve-bench.json")
    doc = json.loads(open(path).read())
    assert doc["backends"] == {"r2cc": {"tok_s": 300}}
    run = doc["run"]
    assert run["command"].startswith("r2cc serve-bench --rounds 1") and run["date"][:2] == "20"
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert run["git_head"] == (head or None)
    # A list (serve-outage's runs) is kept under "results".
    assert json.loads(open(write_result(str(tmp_path), "serve-outage", [1, 2])).read())["results"] == [1, 2]


def test_out_given_as_a_file_is_refused_before_the_run(tmp_path):
    with pytest.raises(UserError, match="--out is a results folder .*serve-bench.json"):
        check_out("result.json", "serve-bench")
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserError, match="give a folder"):
        check_out(str(tmp_path / "f"), "bench")
    check_out(str(tmp_path), "bench")  # a folder, or one still to be made, is fine
    check_out(str(tmp_path / "new"), "bench")
    r = subprocess.run([sys.executable, "-m", "r2cc_serve.cli", "serve-bench", "--out", "x.json"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "--out is a results folder" in r.stderr and "Traceback" not in r.stderr


def test_bench_json_and_out_side_by_side(tmp_path, capsys):
    emit(SimpleNamespace(json="-", out=str(tmp_path)), "bench", {"results": []})
    assert json.loads(capsys.readouterr().out) == {"results": []}  # --json: the report alone
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert doc["results"] == [] and "run" in doc
