"""Analysis and report rendering from a saved result (made up, shaped like a real one)."""

from __future__ import annotations

import json
import os

import pytest

from r2cc_serve.cli import main as cli_main
from r2cc_testbed.loadtest import analysis
from r2cc_testbed.loadtest.report import write_report
from r2cc_testbed.loadtest.rounds import Round
from tests.testbed.loadtest import fakes


def _saved(tmp_path, result) -> str:
    scen = tmp_path / result["scenario"]["name"]
    scen.mkdir()
    (scen / "result.json").write_text(json.dumps(result))
    return str(tmp_path)


def test_analysis_of_a_run_where_the_baseline_breaks():
    a = analysis.analyse(fakes.result())
    r2cc, default = a["backends"]["r2cc"], a["backends"]["default"]
    assert (r2cc["ok"], r2cc["failed"]) == (120, 0) and default["failed"] == 20
    assert all(p["differ"] == 0 for p in r2cc["outputs"]["faulted_vs_fault_free"])
    assert sum(p["differ"] for p in default["outputs"]["faulted_vs_fault_free"]) > 0
    itl99 = r2cc["overheads"]["itl"]["p99"]
    assert 0.0 < itl99["overhead"] < 0.05 and itl99["pairs"] == 2
    assert r2cc["overheads"]["tpot"]["p99"]["target"] == 0.03
    assert r2cc["fault_timing"]["lag_max_s"] < 0.001 and r2cc["fault_timing"]["steps"] == 16
    rows = r2cc["detection"][0]["steps"]
    down = next(r for r in rows if r["step"] == "down h0 rail1")
    up = next(r for r in rows if r["step"] == "up h0 rail1")
    assert down["detected_s"] == pytest.approx(0.0997, abs=1e-3) and down["state"] == "down"
    assert up["back_up_s"] == pytest.approx(0.5997, abs=1e-3) and up["bytes_again_s"] == pytest.approx(0.4997, abs=1e-3)
    assert [r["step"] for r in rows if r["step"].startswith("flap")] == ["flap 1/3 down h0 rail2", "flap 3/3 up h0 rail2"]
    stalls = [s for r in default["rounds"] for s in r["stalls"]]
    assert stalls and stalls[0]["from_s"] == 1.5 and stalls[0]["length_s"] == pytest.approx(6.5)
    assert a["outputs"]["default"]["fault_free"]["differ"] == 0
    assert all(r["itl_max_s"] >= r["itl_p99_s"] > 0 for r in r2cc["rounds"]), r2cc["rounds"]


def test_fault_windows_use_the_actual_times():
    rnd = Round.from_dict(fakes.result()["backends"]["r2cc"]["rounds"][1])
    windows = analysis.fault_windows(rnd, lab_rails=4)
    assert [(round(w["from_s"], 4), round(w["to_s"], 4), w["label"]) for w in windows] == [
        (2.0003, 4.0003, "down h0 rail1"), (5.0003, 5.2506, "flap 100ms x3 h0 rail2")]


def test_rails_that_lose_packets_are_fault_windows_too():
    d = fakes.result()["backends"]["r2cc"]["rounds"][1]
    entries = [(2.0, "h0:1:gray:out"), (4.0, "h0:1:clear"), (5.0, "h0:2:lossy:1"), (6.0, "h0:2:clear"),
               (7.0, "h0:3:marginal:90"), (8.0, "h0:3:clear")]
    d["plan"]["schedule"] = [{"at": at, "do": do} for at, do in entries]
    d["steps"] = [{"entry": n, "kind": do.split(":")[2], "host": 0, "rail": int(do.split(":")[1]),
                   "started": at, "done": at + 0.001} for n, (at, do) in enumerate(entries)]
    windows = analysis.fault_windows(Round.from_dict(d), lab_rails=4)
    assert [(w["from_s"], w["to_s"], w["label"]) for w in windows] == [
        (2.0, 4.0, "gray out >1000 B h0 rail1"), (5.0, 6.0, "lossy 1% h0 rail2"),
        (7.0, 8.0, "marginal 90% both ways >1000 B h0 rail3")]


def test_report_renders_markdown_json_and_figures(tmp_path):
    out = _saved(tmp_path, fakes.result())
    md = open(write_report(out)).read()
    for text in ("## Summary", "## fake", "longest token gap, faulted / fault-free", "### r2cc", "### default", "| fake | r2cc | 120 / 0 | none | identical |",
                 "faulted rounds vs their fault-free rounds: identical", "lag (applied - scheduled)", "detected after 100 ms",
                 "bytes on it again after 500 ms", "![tokens.png](fake/tokens.png)", "outputs, request by request: identical",
                 "one request at a time (no batching): identical"):
        assert text in md, text
    doc = json.load(open(os.path.join(out, "report.json")))
    assert {r["backend"] for r in doc["summary"]} == {"r2cc", "default"}
    for png in ("tokens.png", "latency.png", "itl.png", "rails.png"):
        assert os.path.getsize(os.path.join(out, "fake", png)) > 10_000


def test_the_cli_rerenders_and_says_when_there_is_nothing(tmp_path, capsys):
    out = _saved(tmp_path, fakes.result(default_breaks=False))
    assert cli_main(["loadtest", "report", out]) == 0
    assert "fake" in capsys.readouterr().out
    assert cli_main(["loadtest", "report", str(tmp_path / "fake" / "raw")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli_main(["loadtest", "report", str(empty)]) == 2
    assert "no result.json" in capsys.readouterr().err


def test_run_refuses_unknown_scenarios_before_starting_anything(capsys):
    assert cli_main(["loadtest", "run", "no-such-scenario"]) == 2
    assert "no scenario 'no-such-scenario'" in capsys.readouterr().err


def test_list_shows_every_scenario(capsys):
    assert cli_main(["loadtest", "list"]) == 0
    out = capsys.readouterr().out
    assert "rail-down-restore" in out and "drain-undrain" in out and "h0:1:drain" in out
