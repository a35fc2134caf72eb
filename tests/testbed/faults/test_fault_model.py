"""The one fault model (testbed/r2cc_testbed/faults/model.py): kinds, text forms, validation, schedules. Pure."""

from __future__ import annotations

import dataclasses
import json
import re
from types import SimpleNamespace

import pytest
import yaml

from r2cc_testbed.faults import model as faults
from r2cc_serve.cli import main as cli_main
from r2cc_serve.errors import UserError
from r2cc_testbed.faults.model import FaultSchedule, FaultSpec, parse_fault_text, parse_fault_words
from r2cc_testbed.serving.fault_experiment import check_held, parse_option

# notation -> (what the spec holds, how it reads): one row per kind.
EVERY_KIND = {
    "h0:1:down": (dict(kind="down", host=0, rail=1), "down on h0 rail1"),
    "h1:0:up": (dict(kind="up", host=1, rail=0), "up on h1 rail0"),
    "h0:2:blackhole": (dict(kind="blackhole", rail=2), "blackhole on h0 rail2"),
    "h0:2:clear": (dict(kind="clear", rail=2), "clear on h0 rail2"),
    "h1:3:degrade:100mbit": (dict(kind="degrade", host=1, rail=3, rate="100mbit"), "degrade 100mbit on h1 rail3"),
    "h0:3:flap:200:3": (dict(kind="flap", rail=3, period_ms=200, count=3), "flap 200ms x3 on h0 rail3"),
    "h0:1:lossy:0.5": (dict(kind="lossy", rail=1, loss_pct=0.5), "lossy 0.5% on h0 rail1"),
    "h0:1:gray:in:600": (dict(kind="gray", rail=1, direction="in", max_bytes=600), "gray in >600 B on h0 rail1"),
    "h1:2:marginal:90:out": (dict(kind="marginal", host=1, rail=2, loss_pct=90, direction="out", max_bytes=1000),
                             "marginal 90% out >1000 B on h1 rail2"),
    "h1:all-down": (dict(kind="all-down", host=1, rail=None), "all-down on h1 all rails"),
    "h1:2:drain": (dict(kind="drain", host=1, rail=2), "drain on h1 rail2"),
    "h1:2:undrain": (dict(kind="undrain", host=1, rail=2), "undrain on h1 rail2"),
    "h0:1:failover": (dict(kind="failover", rail=1), "failover on h0 rail1"),
    "h0:1:restore": (dict(kind="restore", rail=1), "restore on h0 rail1"),
}


def test_the_vocabulary_is_covered_once():
    assert sorted(parse_fault_text(t).kind for t in EVERY_KIND) == sorted(faults.KINDS)
    assert len(set(faults.KINDS)) == len(faults.KINDS)
    assert faults.LAB_KINDS == ("down", "up", "blackhole", "clear", "degrade", "flap", "lossy", "gray",
                                "marginal")  # `r2cc lab fault` order
    assert faults.RAIL_FAULTS == ("down", "blackhole", "degrade", "flap", "lossy", "gray", "marginal")  # `r2cc bench`
    assert set(faults.HELD_KINDS) == {"down", "blackhole", "degrade", "flap", "lossy", "gray", "marginal", "all-down",
                                      "drain", "failover"}
    assert set(faults.STEADY_RAIL_FAULTS) == {"down", "blackhole", "degrade", "lossy", "gray", "marginal"}


@pytest.mark.parametrize("notation", EVERY_KIND)
def test_every_kind_in_notation_and_words(notation):
    fields, text = EVERY_KIND[notation]
    spec = parse_fault_text(notation)
    assert {k: getattr(spec, k) for k in fields} == fields
    assert spec.text == text and spec.notation == notation
    assert parse_fault_text(spec.notation) == spec  # the notation reads back
    words = notation.split(":")[2 if spec.rail is not None else 1:]
    assert parse_fault_words(words, spec.host, spec.rail) == spec
    assert FaultSpec(**json.loads(json.dumps(dataclasses.asdict(spec)))) == spec  # JSON round trip


def test_spellings_defaults_and_normalisation():
    assert parse_fault_text(" 1:rail2:down ") == FaultSpec("down", 1, 2)  # 'h' and 'rail' are optional
    assert parse_fault_text("h0:1:degrade:1Gbit").rate == "1gbit"
    flap = parse_fault_words(["flap"], 0, 1)
    assert (flap.period_ms, flap.count) == faults.FLAP_DEFAULTS and flap.duration_s == 3.2
    assert FaultSpec("flap", rail=1) == flap
    # A host fault acts on every rail: a rail given with it is dropped, not an error.
    assert parse_fault_words(["all-down"], 0, 3) == parse_fault_text("h0:3:all-down") == FaultSpec("all-down")
    held = FaultSpec("down", 0, 1, after_s=2, hold_s=4.5)
    assert held.text == "down on h0 rail1 after 2 s for 4.5 s"


# gray and marginal: every way to write them, the spec it makes and the notation it reads back as
SIZE_FORMS = [
    ("h0:1:gray", ["gray"], "both", 1000, None, "h0:1:gray"),
    ("h0:1:gray:out", ["gray", "out"], "out", 1000, None, "h0:1:gray:out"),
    ("h0:1:gray:in:600", ["gray", "in", "600"], "in", 600, None, "h0:1:gray:in:600"),
    ("h0:1:gray:600", ["gray", "600"], "both", 600, None, "h0:1:gray:both:600"),
    ("h0:1:gray:both:1000", ["gray", "both", "1000"], "both", 1000, None, "h0:1:gray"),
    ("h0:1:marginal:90", ["marginal", "90"], "both", 1000, 90.0, "h0:1:marginal:90"),
    ("h0:1:marginal:0.5:out", ["marginal", "0.5", "out"], "out", 1000, 0.5, "h0:1:marginal:0.5:out"),
    ("h0:1:marginal:90:both", ["marginal", "90", "both"], "both", 1000, 90.0, "h0:1:marginal:90"),
]


@pytest.mark.parametrize("notation, words, direction, max_bytes, loss_pct, canonical", SIZE_FORMS)
def test_gray_and_marginal_in_notation_and_words(notation, words, direction, max_bytes, loss_pct, canonical):
    spec = parse_fault_text(notation)
    assert (spec.direction, spec.max_bytes, spec.loss_pct) == (direction, max_bytes, loss_pct)
    assert parse_fault_words(words, 0, 1) == spec  # `r2cc lab fault h0 1 gray out 600`
    assert spec.notation == canonical and parse_fault_text(canonical) == spec
    assert spec.undo(4) == [FaultSpec("clear", 0, 1)]


@pytest.mark.parametrize("words, message", [
    ([], "no fault kind given"),
    (["explode"], "unknown fault kind 'explode': use one of down, up"),
    (["degrade"], "degrade takes one argument, RATE (e.g. 100mbit), got 0"),
    (["degrade", "1gbit", "2gbit"], "degrade takes one argument"),
    (["degrade", "fast"], "rate 'fast' is not valid"),
    (["flap", "200"], "flap takes PERIOD_MS and COUNT (e.g. 200 and 3), or none for 400 and 8, got 1"),
    (["flap", "200", "3", "1"], "got 3"),
    (["flap", "2OO", "3"], "flap needs whole numbers PERIOD_MS and COUNT, got '2OO 3'"),
    (["flap", "1", "3"], "PERIOD_MS >= 2 and COUNT >= 1, got 1 and 3"),
    (["flap", "200", "0"], "PERIOD_MS >= 2 and COUNT >= 1, got 200 and 0"),
    (["down", "7"], "down takes no arguments, got 1"),
    (["drain", "now"], "drain takes no arguments"),
    (["all-down", "x"], "all-down takes no arguments"),
    (["gray", "sideways"], "gray direction 'sideways' is not valid: use both, out or in (gray [both|out|in] [BYTES]"),
    (["gray", "out", "-5"], "gray BYTES -5 is not valid: use a whole number of bytes from 68 to 65535"),
    (["gray", "in", "1.5k"], "gray BYTES '1.5k' is not valid"),
    (["gray", "67"], "gray BYTES 67 is not valid"),
    (["gray", "600", "out"], "gray direction '600' is not valid"),
    (["gray", "out", "600", "x"],
     "gray takes at most DIR and BYTES: gray [both|out|in] [BYTES], e.g. gray out 600, got 3"),
    (["marginal"], "marginal takes PCT and at most DIR: marginal PCT [both|out|in], e.g. marginal 90 out, got 0"),
    (["marginal", "150"], "marginal needs a percentage above 0 and at most 100 (marginal PCT [both|out|in]"),
    (["marginal", "0.25"], "marginal 0.25%: use steps of 0.1%"),
    (["marginal", "90", "up"], "marginal direction 'up' is not valid: use both, out or in (marginal PCT"),
])
def test_bad_words(words, message):
    with pytest.raises(UserError, match=re.escape(message)):
        parse_fault_words(words, 0, 1)


def test_a_tool_names_the_kinds_it_takes():
    with pytest.raises(UserError, match="'drain' cannot be used here: use one of down, blackhole, degrade, flap, lossy, "
                                        "gray, marginal$"):
        parse_fault_words(["drain"], 0, 1, faults.RAIL_FAULTS)
    with pytest.raises(UserError, match="unknown fault kind 'x': use one of down, up, blackhole, clear, degrade, flap, "
                                        "lossy, gray, marginal$"):
        parse_fault_words(["x"], 0, 1, faults.LAB_KINDS)


@pytest.mark.parametrize("text, message", [
    ("x", "not valid: use h<HOST>:<RAIL>:<KIND>"),
    ("", "not valid"),
    ("h0:1:DOWN", "not valid"),
    ("h0:1:", "not valid"),
    ("hx:1:down", "not valid"),
    ("h0:-1:down", "not valid"),
    ("h0:down", "down needs a rail: h0:<RAIL>:down"),
    ("h0:1:explode", "unknown fault kind 'explode'"),
    ("h0:1:degrade", "degrade takes one argument"),
    ("h0:1:flap:200", "flap takes PERIOD_MS and COUNT"),
    ("h0:1:down:now", "down takes no arguments"),
    ("h0:1:lossy", "lossy takes one argument, PCT"),
    ("h0:1:lossy:0", "above 0 and at most 100"),
    ("h0:1:lossy:150", "above 0 and at most 100"),
    ("h0:1:lossy:0.25", "steps of 0.1%"),
    ("h0:1:lossy:lots", "above 0 and at most 100"),
    ("h0:1:gray:sideways", "gray direction 'sideways' is not valid"),
    ("h0:1:gray:out:-5", "gray BYTES -5 is not valid"),
    ("h0:1:gray:out:70000", "gray BYTES 70000 is not valid"),
    ("h0:1:gray:out::", "not valid: use h<HOST>"),
    ("h0:1:marginal:150", "marginal needs a percentage above 0 and at most 100"),
    ("h0:1:marginal", "marginal takes PCT"),
])
def test_bad_notation(text, message):
    with pytest.raises(UserError, match=message):
        parse_fault_text(text)


@pytest.mark.parametrize("fields, message", [
    (dict(kind="explode"), "unknown fault kind"),
    (dict(kind="down"), "down needs a rail"),
    (dict(kind="down", host=-1, rail=0), "host must be a whole number >= 0, got -1"),
    (dict(kind="down", host=True, rail=0), "host must be a whole number"),
    (dict(kind="down", rail="1"), "rail must be a whole number >= 0, got '1'"),
    (dict(kind="degrade", rail=0), "degrade needs a rate"),
    (dict(kind="down", rail=0, rate="1gbit"), "down takes no rate"),
    (dict(kind="down", rail=0, count=3), "down takes no flap period or count"),
    (dict(kind="down", rail=0, loss_pct=1), "down takes no loss percentage"),
    (dict(kind="lossy", rail=0), "lossy needs a percentage"),
    (dict(kind="down", rail=0, direction="out"), "down takes no direction or packet size"),
    (dict(kind="lossy", rail=0, loss_pct=1, max_bytes=600), "lossy takes no direction or packet size"),
    (dict(kind="gray", rail=0, loss_pct=5), "gray takes no loss percentage"),
    (dict(kind="gray", rail=0, max_bytes=True), "gray BYTES True is not valid"),
    (dict(kind="gray", rail=0, max_bytes=600.0), "gray BYTES 600.0 is not valid"),
    (dict(kind="marginal", rail=0), "marginal needs a percentage"),
    (dict(kind="marginal", rail=0, loss_pct=5, max_bytes=600), "marginal drops among packets longer than 1000 bytes"),
    (dict(kind="flap", rail=0, period_ms=200.5), "flap needs whole numbers"),
    (dict(kind="down", rail=0, after_s=-1), "after_s must be a number of seconds >= 0, got -1"),
    (dict(kind="down", rail=0, hold_s=float("inf")), "hold_s must be a number of seconds"),
    (dict(kind="down", rail=0, hold_s="5"), "hold_s must be a number of seconds"),
])
def test_a_spec_is_valid_or_not_made(fields, message):
    with pytest.raises(UserError, match=message):
        FaultSpec(**fields)


def test_targets_undo_and_admin():
    assert FaultSpec("all-down", host=1).target_rails(3) == [0, 1, 2]
    assert [s.notation for s in FaultSpec("all-down", host=1).per_rail(2)] == ["h1:0:down", "h1:1:down"]
    assert FaultSpec("down", 0, 2).per_rail(4) == [FaultSpec("down", 0, 2)]
    undo = {t: [u.notation for u in parse_fault_text(t).undo(2)] for t in EVERY_KIND}
    assert undo == {
        "h0:1:down": ["h0:1:clear"], "h1:0:up": [], "h0:2:blackhole": ["h0:2:clear"], "h0:2:clear": [],
        "h1:3:degrade:100mbit": ["h1:3:clear"], "h0:3:flap:200:3": ["h0:3:clear"], "h0:1:lossy:0.5": ["h0:1:clear"],
        "h0:1:gray:in:600": ["h0:1:clear"], "h1:2:marginal:90:out": ["h1:2:clear"],
        "h1:all-down": ["h1:0:clear", "h1:1:clear"], "h1:2:drain": ["h1:2:undrain"], "h1:2:undrain": [],
        "h0:1:failover": ["h0:1:restore"], "h0:1:restore": []}
    assert [t for t in EVERY_KIND if parse_fault_text(t).is_admin] == [
        "h1:2:drain", "h1:2:undrain", "h0:1:failover", "h0:1:restore"]
    assert FaultSpec("down", 0, 1).duration_s == 0.0


def test_check_target():
    assert FaultSpec("down", 1, 3).check_target(2, 4) == FaultSpec("down", 1, 3)
    assert FaultSpec("all-down", host=1).check_target(2, 1)
    with pytest.raises(UserError, match="host 2 is outside the lab's hosts 0..1"):
        FaultSpec("down", 2, 0).check_target(2, 4)
    with pytest.raises(UserError, match="rail 4 is outside the lab's rails 0..3"):
        FaultSpec("drain", 0, 4).check_target(2, 4)


def test_labelled_says_where_an_error_came_from():
    with pytest.raises(UserError, match="^--fault 'x': not valid"):
        with faults.labelled("--fault 'x'"):
            parse_fault_text("x")
    with faults.labelled("not used"):  # no error, no change
        pass


# --- schedules ----------------------------------------------------------------------------

SCHEDULE_YAML = """
faults:
  - {at: 0, do: "h0:1:down"}
  - {at: 5, do: "h0:1:clear"}
  - {at: 5, do: "h1:2:drain"}
  - {at: 12.5, do: "h1:2:undrain"}
  - {at: 20, do: "h0:3:degrade:100mbit"}
  - {at: 30, do: "h0:3:flap:200:5"}
  - {at: 40, do: "h1:all-down"}
  - {at: 50, do: "h0:0:failover"}
  - {at: 60, do: "h0:0:restore"}
"""


def test_schedule_from_yaml():
    schedule = FaultSchedule.parse(yaml.safe_load(SCHEDULE_YAML)["faults"], source="scenario.yaml faults")
    assert [s.after_s for s in schedule.entries] == [0, 5, 5, 12.5, 20, 30, 40, 50, 60]
    assert schedule.entries[4] == FaultSpec("degrade", 0, 3, rate="100mbit", after_s=20)
    assert schedule.describe() == [
        "at 0 s: down on h0 rail1", "at 5 s: clear on h0 rail1", "at 5 s: drain on h1 rail2",
        "at 12.5 s: undrain on h1 rail2", "at 20 s: degrade 100mbit on h0 rail3",
        "at 30 s: flap 200ms x5 on h0 rail3", "at 40 s: all-down on h1 all rails",
        "at 50 s: failover on h0 rail0", "at 60 s: restore on h0 rail0"]
    assert FaultSchedule.parse(schedule.to_list()) == schedule
    assert schedule.check(hosts=2, rails=4) is schedule
    assert FaultSchedule.parse([]) == FaultSchedule()


def test_schedule_check_names_the_entry_outside_the_lab():
    schedule = FaultSchedule.parse([{"at": 1, "do": "h0:1:down"}, {"at": 2, "do": "h3:1:drain"}])
    with pytest.raises(UserError, match=r"^fault schedule entry 2 \(h3:1:drain\): host 3 is outside the lab's hosts 0..1$"):
        schedule.check(hosts=2, rails=4)
    with pytest.raises(UserError, match=r"^x entry 1 \(h0:1:down\): rail 1 is outside the lab's rails 0..0$"):
        schedule.check(hosts=2, rails=1, source="x")


@pytest.mark.parametrize("entries, message", [
    (None, "fault schedule: expected a list of entries like h0:1:down@10s or {at: SECONDS, do: FAULT}, got NoneType"),
    ({"at": 1, "do": "h0:1:down"}, "expected a list of .* got dict"),
    (["h0:1:down"], "fault schedule entry 1: 'h0:1:down': a schedule needs the time of each fault: add @SECONDS"),
    ([7], "fault schedule entry 1: expected NOTATION@SECONDS\\[\\+SECONDS\\] or {at: SECONDS, do: FAULT}, got 7"),
    ([{"do": "h0:1:down"}], "fault schedule entry 1: missing at: an entry is {at: SECONDS, do: FAULT}"),
    ([{"at": 1}], "entry 1: missing do"),
    ([{}], "entry 1: missing at, do"),
    ([{"at": 1, "do": "h0:1:down", "for": 5}], "entry 1: unknown key\\(s\\) for: an entry is"),
    ([{"at": "10s", "do": "h0:1:down"}], "entry 1: at must be a number of seconds >= 0, got '10s'"),
    ([{"at": -1, "do": "h0:1:down"}], "entry 1: at must be a number of seconds >= 0, got -1"),
    ([{"at": True, "do": "h0:1:down"}], "entry 1: at must be a number"),
    ([{"at": float("nan"), "do": "h0:1:down"}], "entry 1: at must be a number"),
    ([{"at": 1, "do": None}], "entry 1: at 1 s, do None: expected a fault or admin action as text: use h<HOST>"),
    ([{"at": 1, "do": {"kind": "down"}}], "entry 1: at 1 s, do {'kind': 'down'}: expected a fault"),
    ([{"at": 1, "do": "h0:1:down"}, {"at": 2.5, "do": "h0:1:explode"}],
     "fault schedule entry 2: at 2.5 s, do 'h0:1:explode': unknown fault kind 'explode'"),
    ([{"at": 1, "do": "h0:1:degrade"}], "entry 1: at 1 s, do 'h0:1:degrade': degrade takes one argument"),
    ([{"at": 1, "do": "h0:drain"}], "entry 1: at 1 s, do 'h0:drain': drain needs a rail"),
    ([{"at": 9, "do": "h0:1:down"}, {"at": 3, "do": "h0:1:clear"}],
     "fault schedule entry 2: at 3 s comes before entry 1's 9 s: list the entries in time order"),
])
def test_bad_schedules_name_the_entry_and_what_is_expected(entries, message):
    with pytest.raises(UserError, match=message.replace("{", r"\{").replace("}", r"\}")):
        FaultSchedule.parse(entries)


# --- the tools ----------------------------------------------------------------------------

def test_serving_option_and_held_faults():
    lab = SimpleNamespace(hosts=2, rails=4)
    spec = parse_option("degrade:100mbit", host=0, rail=1, after_s=3, hold_s=5)
    assert check_held(spec, lab) == FaultSpec("degrade", 0, 1, rate="100mbit", after_s=3, hold_s=5)
    assert parse_option("all-down", host=1, rail=1, after_s=0, hold_s=1).rail is None
    assert parse_option("flap", host=0, rail=2, after_s=0, hold_s=1).period_ms == 400
    with pytest.raises(UserError, match="^--fault 'up': 'up' cannot be used here: use one of down"):
        parse_option("up", host=0, rail=1, after_s=3, hold_s=5)
    with pytest.raises(UserError, match="^--fault 'down': after_s must be a number of seconds"):
        parse_option("down", host=0, rail=1, after_s=-3, hold_s=5)
    with pytest.raises(UserError, match="^fault down on h0 rail4 .*: rail 4 is outside the lab's rails 0..3"):
        check_held(parse_option("down", host=0, rail=4, after_s=3, hold_s=5), lab)
    with pytest.raises(UserError, match="a held fault needs after_s and hold_s"):
        check_held(FaultSpec("down", 0, 1), lab)
    with pytest.raises(UserError, match="clear cannot be held and undone"):
        check_held(FaultSpec("clear", 0, 1, after_s=1, hold_s=1), lab)
    gray = check_held(parse_option("gray:out:600", host=0, rail=1, after_s=3, hold_s=5), lab)
    assert (gray.kind, gray.direction, gray.max_bytes, gray.hold_s) == ("gray", "out", 600, 5)
    assert check_held(parse_option("marginal:90", host=0, rail=1, after_s=3, hold_s=5), lab).loss_pct == 90


@pytest.mark.parametrize("argv, message", [
    (["demo", "--fault", "explode"], "--fault 'explode': unknown fault kind 'explode'"),
    (["demo", "--fault", "degrade"], "--fault 'degrade': degrade takes one argument"),
    (["demo", "--backend", "default", "--fault", "failover"], "--fault failover needs --backend r2cc"),
    (["serve-bench", "--fault", "clear"], "--fault 'clear': 'clear' cannot be used here"),
    (["bench", "--fault", "h0:1:drain"], "--fault 'h0:1:drain': 'drain' cannot be used here"),
    (["lab", "fault", "h0", "1", "gray", "sideways"], "gray direction 'sideways' is not valid: use both, out or in"),
    (["lab", "fault", "h0", "1", "gray", "out", "-5"], "gray BYTES -5 is not valid"),
    (["lab", "fault", "h0", "1", "marginal", "150"], "marginal needs a percentage above 0 and at most 100"),
    (["demo", "--fault", "gray:sideways"], "--fault 'gray:sideways': gray direction 'sideways' is not valid"),
    (["serve-bench", "--fault", "gray:out:-5"], "--fault 'gray:out:-5': gray BYTES -5 is not valid"),
    (["bench", "--fault", "h0:1:marginal:150"], "--fault 'h0:1:marginal:150': marginal needs a percentage"),
    (["bench", "--hold-fault", "h0:1:gray:sideways"], "--hold-fault 'h0:1:gray:sideways': gray direction"),
    (["bench", "--fault", "h0:1:gray:1500"], "--fault 'h0:1:gray:1500': gray drops IP packets longer than 1500 "
                                              "bytes, and the lab's rails (MTU 1500) carry none: use BYTES below the MTU"),
    (["bench", "--mtu", "900", "--backend", "r2cc", "--hold-fault", "h0:1:marginal:5"],
     "--hold-fault 'h0:1:marginal:5': marginal drops IP packets longer than 1000 bytes"),
])
def test_tools_refuse_bad_faults_before_building_anything(argv, message, capsys):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
