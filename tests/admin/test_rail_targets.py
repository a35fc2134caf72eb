"""Which rail `r2cc rails ACTION HOST:RAIL` means: h<HOST>:<RAIL> as in the fault notation (the
host by its place in the admin API's view) or HOSTNAME:<RAIL>; every bad target is one line
that shows the form or what the view has. Pure: no server."""

import pytest

from r2cc_serve.admin.actions import ACTIONS, hosts_in_view, parse_rail_target, resolve
from r2cc_serve.errors import UserError

# GET /r2cc/v1/rails lists rails host by host, hosts sorted by name.
VIEW = [{"host": h, "rail": k} for h in ("node-a", "node-b") for k in range(3)]


@pytest.mark.parametrize("text, host, rail", [("h1:2", "node-b", 2), ("1:2", "node-b", 2), ("h0:rail1", "node-a", 1),
                                              ("node-b:0", "node-b", 0), (" node-a:rail2 ", "node-a", 2)])
def test_a_host_by_its_index_or_its_name(text, host, rail):
    target = parse_rail_target(text)
    assert (resolve(target, VIEW), target.rail) == (host, rail)


def test_the_index_counts_hosts_in_the_order_the_view_lists_them():
    assert hosts_in_view(VIEW) == ["node-a", "node-b"]


@pytest.mark.parametrize("text", ["h1", "h1:", ":2", "h1:x", "h1:2:drain", "h1:2@3s", "a/b:1", "h1 :2", ""])
def test_malformed_text_shows_the_form(text):
    with pytest.raises(UserError, match=r"is not a rail: give h<HOST>:<RAIL> or HOSTNAME:<RAIL>, e\.g\. h1:2"):
        parse_rail_target(text)


@pytest.mark.parametrize("text, says", [
    ("h9:2", "h9:2: no host h9: the view has 2 hosts, h0 node-a, h1 node-b"),
    ("node-c:1", "node-c:1: no host named 'node-c'; the view has h0 node-a, h1 node-b"),
    ("h1:7", "h1:7: node-b has no rail 7; its rails are 0, 1, 2"),
    ("node-a:3", "node-a:3: node-a has no rail 3; its rails are 0, 1, 2"),
])
def test_a_target_the_view_does_not_have_says_what_it_has(text, says):
    with pytest.raises(UserError) as info:
        resolve(parse_rail_target(text), VIEW)
    assert str(info.value) == says


def test_no_hosts_says_no_group_is_attached():
    with pytest.raises(UserError, match="shows no hosts"):
        resolve(parse_rail_target("h0:0"), [])


def test_a_host_named_like_another_ones_index_is_refused_not_guessed():
    """Hosts h1 and h2: 'h1' names the first and is the index of the second. Acting on either
    would be a guess; h0 and h1 by index are not."""
    view = [{"host": h, "rail": 0} for h in ("h1", "h2")]
    with pytest.raises(UserError, match="both a host's name and the index of h2"):
        resolve(parse_rail_target("h1:0"), view)
    assert resolve(parse_rail_target("h0:0"), view) == "h1"
    same = [{"host": h, "rail": 0} for h in ("h0", "h1")]  # name and index agree: no doubt
    assert resolve(parse_rail_target("h1:0"), same) == "h1"


def test_the_fault_notation_reads_host_and_rail_with_the_same_pieces():
    """The test bed's schedules name an admin action as h<HOST>:<RAIL>:<KIND>: the host and rail
    parts are the runtime's, and its admin kinds are the API's actions."""
    from r2cc_testbed.faults.model import ADMIN_ACTIONS, parse_fault_text

    assert ADMIN_ACTIONS == tuple(ACTIONS) == ("drain", "undrain", "failover", "restore")
    spec = parse_fault_text("h1:rail2:drain")
    assert (spec.host, spec.rail, spec.kind) == (1, 2, "drain")
    target = parse_rail_target("h1:rail2")
    assert (target.host_index, target.rail) == (spec.host, spec.rail)
