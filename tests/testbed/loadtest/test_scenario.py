"""Scenario files: the shipped ones parse (plain and --quick), mistakes name the key at fault."""

from __future__ import annotations

import os
import re

import pytest
import yaml

from r2cc_serve.errors import UserError
from r2cc_testbed.loadtest.scenario import list_scenarios, load_scenario, merge, parse_scenario, scenario_dir

SHIPPED = {"rail-down-restore", "blackhole", "flap", "degrade", "drain-undrain", "two-rails-down",
           "host-all-rails-down", "degraded-host", "lossy-rail", "lossy-vs-drained", "long-flap", "gray-rail"}
BASE = {"load": {"concurrency": 2, "requests": 4}, "faults": [{"at": 1, "do": "h0:1:down"}, {"at": 2, "do": "h0:1:up"}]}


def test_the_shipped_scenarios_parse_plain_and_quick():
    scenarios = list_scenarios()
    assert {s.name for s in scenarios} == SHIPPED
    for s in scenarios:
        quick = load_scenario(s.path, quick=True)
        assert s.method.pairs >= 3 and quick.method.pairs == 1
        assert s.schedule.entries and quick.schedule_end_s < s.schedule_end_s
        assert os.path.basename(s.path) == f"{s.name}.yaml"


def test_the_headline_scenario_is_the_issues():
    s = load_scenario(os.path.join(scenario_dir(), "rail-down-restore.yaml"))
    assert s.backends == ("r2cc", "default", "default-mptcp") and s.shape == "two-nodes"
    assert s.load.saturation_fraction == 0.7 and s.targets == {"tpot_p99": 0.03, "e2el_p99": 0.05}
    down, up = s.schedule.entries
    assert (down.kind, up.kind, up.after_s - down.after_s) == ("down", "up", 10.0)
    assert down.rail == 0, "rail 0: the one rail every backend uses (gloo's only one, MPTCP's first subflow)"


def test_every_shipped_comparison_runs_the_mptcp_baseline():
    for sc in list_scenarios():
        if sc.backends != ("r2cc",):
            assert "default-mptcp" in sc.backends and "default" in sc.backends, sc.name


def test_reference_rounds_can_hold_faults_of_their_own():
    s = load_scenario(os.path.join(scenario_dir(), "lossy-vs-drained.yaml"))
    assert [x.notation for x in s.reference.entries] == ["h0:1:drain", "h0:1:undrain"]
    assert [x.notation for x in s.schedule.entries] == ["h0:1:lossy:1", "h0:1:clear"]
    assert s.to_dict()["reference"] == [{"at": 20.0, "do": "h0:1:drain"}, {"at": 40.0, "do": "h0:1:undrain"}]
    assert parse_scenario(BASE).reference.entries == ()
    with pytest.raises(UserError, match="backends: \\[r2cc\\]"):
        parse_scenario({**BASE, "reference_faults": [{"at": 1, "do": "h0:1:drain"}]})
    with pytest.raises(UserError, match="reference_faults entry 1"):
        parse_scenario({**BASE, "reference_faults": [{"at": 1, "do": "h9:1:down"}]})


def test_mptcp_and_rails_baselines_need_two_nodes():
    with pytest.raises(UserError, match="two-nodes shape"):
        parse_scenario({**BASE, "deployment": {"shape": "single", "backends": ["r2cc", "default-mptcp"]}})
    assert parse_scenario({**BASE, "deployment": {"backends": ["default-rails"]}}).backends == ("default-rails",)


def test_defaults_and_requests_from_a_rate():
    s = parse_scenario({**BASE, "load": {"request_rate": 2, "duration_s": 10}})
    assert s.load.requests_at(s.load.request_rate) == 20
    assert (s.shape, s.hosts, s.rails, s.rate, s.method.pairs) == ("two-nodes", 2, 4, "1gbit", 3)


@pytest.mark.parametrize("change, message", [
    ({"lod": {}}, "unknown key(s) lod"),
    ({"load": {"concurrency": 2}}, "exactly one of requests and duration_s"),
    ({"load": {"concurrency": 2, "request_rate": 1, "requests": 3}}, "exactly one of request_rate"),
    ({"load": {"request_rate": "170%", "requests": 3}}, "share of saturation"),
    ({"load": {"concurrency": 2, "duration_s": 3}}, "needs a request_rate"),
    ({"load": {"concurrency": 2, "requests": 3, "dataset": "nope.jsonl"}}, "no such file"),
    ({"deployment": {"backends": ["r2cc", "gloo"]}}, "deployment.backends"),
    ({"deployment": {"shape": "four-nodes"}}, "deployment.shape"),
    ({"lab": {"rate": "fast"}}, "lab.rate"),
    ({"lab": {"hosts": 3}}, "use 2"),
    ({"faults": [{"at": 1, "do": "h0:9:down"}]}, "rail 9 is outside"),
    ({"faults": [{"at": 1, "do": "h0:1:drain"}]}, "backends: [r2cc]"),
    ({"faults": [{"at": 2, "do": "h0:1:down"}, {"at": 1, "do": "h0:1:up"}]}, "time order"),
    ({"method": {"pairs": 0}}, "method.pairs"),
    ({"targets": {"tpot_p98": "3%"}}, "targets.tpot_p98"),
    ({"name": "Bad Name"}, "lowercase"),
])
def test_mistakes_are_named(change, message):
    with pytest.raises(UserError, match=re.escape(message)):
        parse_scenario({**BASE, **change})


def test_quick_needs_a_quick_section_and_overrides_merge(tmp_path):
    with pytest.raises(UserError, match="quick"):
        parse_scenario(BASE, quick=True)
    doc = {**BASE, "method": {"pairs": 4, "settle_s": 1}, "quick": {"method": {"pairs": 1}}}
    s = parse_scenario(doc, quick=True)
    assert (s.method.pairs, s.method.settle_s, s.quick) == (1, 1.0, True)
    assert merge({"a": {"b": 1, "c": [1]}}, {"a": {"c": [2]}}) == {"a": {"b": 1, "c": [2]}}


def test_a_broken_file_is_a_user_error_naming_it(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("load: [unclosed\n")
    with pytest.raises(UserError, match="bad.yaml is not valid YAML"):
        load_scenario(str(bad))
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({**BASE, "load": {"concurrency": 0, "requests": 1}}))
    with pytest.raises(UserError, match=r"other.yaml: load.concurrency"):
        load_scenario(str(other))
    with pytest.raises(UserError, match="cannot read"):
        load_scenario(str(tmp_path / "missing.yaml"))


def test_a_local_dataset_is_found_beside_the_scenario(tmp_path):
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hello"}\n')
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({**BASE, "load": {"concurrency": 1, "requests": 1, "dataset": "prompts.jsonl"}}))
    assert load_scenario(str(f)).load.dataset == str(tmp_path / "prompts.jsonl")


def test_command_line_backends_and_pairs_override_the_file():
    import argparse

    from r2cc_testbed.loadtest.cli import command_line_overrides

    path = os.path.join(scenario_dir(), "rail-down-restore.yaml")
    args = argparse.Namespace(backends="r2cc", pairs=8)
    s = load_scenario(path, overrides=command_line_overrides(args))
    assert (s.backends, s.method.pairs) == (("r2cc",), 8)
    quick = load_scenario(path, quick=True, overrides=command_line_overrides(argparse.Namespace(backends=None, pairs=2)))
    assert (quick.method.pairs, quick.load.concurrency) == (2, 4)  # the rest of --quick stays
    with pytest.raises(UserError, match="deployment.backends"):
        load_scenario(path, overrides=command_line_overrides(argparse.Namespace(backends="gloo", pairs=None)))
    with pytest.raises(UserError, match="--pairs 0"):
        command_line_overrides(argparse.Namespace(backends=None, pairs=0))
    drain = os.path.join(scenario_dir(), "drain-undrain.yaml")
    with pytest.raises(UserError, match="admin API"):  # admin actions need r2cc
        load_scenario(drain, overrides=command_line_overrides(argparse.Namespace(backends="default", pairs=None)))
