"""The admin API's rail actions, and how a command names the rail one is for.

A rail is named as in the fault notation (docs/faults.md), without the kind:

    h<HOST>:<RAIL>     h1:2    the host by its index: h0 is the first host the admin API's rail
                               view lists (GET /r2cc/v1/rails, `r2cc rails`: sorted by name)
    HOSTNAME:<RAIL>    node0:2 the host by the name the view shows

The `h` may be left out and the rail may read `rail2`, as in a fault. Pure: no HTTP here, so the
test bed's fault parser builds on the same pieces.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from r2cc_serve.errors import UserError

# Each action of POST /r2cc/v1/rails/{host}/{rail}/{action}, with what it does (the route's summary).
ACTIONS = {
    "drain": "Drain: no new chunks on this rail, in-flight ones finish, then 'drained'",
    "undrain": "Undrain: the rail takes new chunks again",
    "failover": "Fail over now: in-flight chunks re-sent on other rails; kept out until restore",
    "restore": "End a failover or a flap hold: the rail is probed and re-admitted (a hold ends at both ends)",
}
FORCEABLE = ("drain", "failover")  # refused on a host's last healthy rail unless forced

# The notation's first two parts, one capturing group each: the fault parser's too.
HOST_INDEX = r"h?(\d+)"
RAIL_INDEX = r"(?:rail)?(\d+)"
TARGET_FORM = "h<HOST>:<RAIL> or HOSTNAME:<RAIL>"
TARGET_HELP = (f"{TARGET_FORM}, e.g. h1:2 (h<N> counts the hosts in the order `r2cc rails` lists them, "
               "from h0) or node0:2 (a host's name as it shows it)")

_INDEX = re.compile(rf"^{HOST_INDEX}$")
_TARGET = re.compile(rf"^(?P<host>[^:/\s]+):{RAIL_INDEX}$")


@dataclass(frozen=True)
class RailTarget:
    """A rail as the operator typed it; which host `host` is takes the view (resolve)."""
    text: str
    host: str             # 'h1', '1' or a host name, as typed
    rail: int

    @property
    def host_index(self) -> int | None:
        m = _INDEX.match(self.host)
        return int(m.group(1)) if m else None


def parse_rail_target(text: str) -> RailTarget:
    """'h1:2', '1:rail2', 'node0:2' -> RailTarget; UserError showing the form otherwise."""
    m = _TARGET.match(str(text).strip())
    if not m:
        raise UserError(f"{text!r} is not a rail: give {TARGET_FORM}, e.g. h1:2 or node0:2")
    return RailTarget(str(text).strip(), m.group("host"), int(m.group(2)))


def hosts_in_view(rails: list[dict]) -> list[str]:
    """The hosts in the order GET /r2cc/v1/rails lists their rails: what h0, h1... count."""
    return list(dict.fromkeys(r["host"] for r in rails))


def _listed(hosts: list[str]) -> str:
    return ", ".join(f"h{i} {h}" for i, h in enumerate(hosts))


def resolve(target: RailTarget, rails: list[dict]) -> str:
    """The name of the host `target` means in this view (GET /r2cc/v1/rails' list), once its rail
    is known to be there; UserError saying what the view has otherwise."""
    hosts = hosts_in_view(rails)
    if not hosts:
        raise UserError(f"{target.text}: the admin API shows no hosts (no r2cc group is attached to it yet)")
    index = target.host_index
    if index is None:
        if target.host not in hosts:
            raise UserError(f"{target.text}: no host named {target.host!r}; the view has {_listed(hosts)}")
        host = target.host
    elif index >= len(hosts):
        raise UserError(f"{target.text}: no host h{index}: the view has {len(hosts)} "
                        f"host{'s' if len(hosts) > 1 else ''}, {_listed(hosts)}")
    else:
        host = hosts[index]
        if target.host in hosts and target.host != host:  # acting on the wrong host must not be a guess
            raise UserError(f"{target.text}: {target.host!r} is both a host's name and the index of {host}; "
                            f"name the host you mean by its index: {_listed(hosts)}")
    have = [r["rail"] for r in rails if r["host"] == host]
    if target.rail not in have:
        raise UserError(f"{target.text}: {host} has no rail {target.rail}; its rails are "
                        f"{', '.join(map(str, have))}")
    return host
