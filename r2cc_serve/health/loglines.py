"""The r2cc log lines that tools read back: written and parsed in this one place.

The serving tools (serving/evidence.py) tail vLLM's logs for rail transitions and for the
rails a group came up on; the monitor and the vLLM communicator write those lines. Keeping
the format and its parser together means a change to one cannot silently break the other.
"""

from __future__ import annotations

import re

_TRANSITION = re.compile(r"r2cc: (?P<group>\S+) rank (?P<rank>\d+) rail(?P<rail>\d+) to rank (?P<peer>\d+): "
                         r"(?P<old>\w+) -> (?P<new>\w+)(?: \((?P<reason>.*)\))?\s*$")
_GROUP_UP = re.compile(r"r2cc: group (?P<group>\S+) rank (?P<rank>\d+)/\d+ .* up on rails (?P<rails>\[[^\]]*\])")


def transition_line(group: str, rank: int, rail: int, peer: int, old: str, new: str, reason: str = "") -> str:
    return f"r2cc: {group} rank {rank} rail{rail} to rank {peer}: {old} -> {new}" + (f" ({reason})" if reason else "")


def parse_transition(line: str) -> dict | None:
    """The fields of a transition line found anywhere in ``line`` (log prefixes allowed), or None."""
    i = line.find("r2cc: ")
    m = _TRANSITION.match(line[i:]) if i >= 0 else None
    if not m:
        return None
    return {"group": m["group"], "rank": int(m["rank"]), "rail": int(m["rail"]), "peer": int(m["peer"]),
            "old": m["old"], "new": m["new"], "reason": m["reason"] or ""}


def group_up_line(group: str, rank: int, world: int, global_rank: int, node: int, rail_ips: list[str],
                  netns: str | None = None, fallback: list[str] | None = None) -> str:
    return (f"r2cc: group {group} rank {rank}/{world} (global {global_rank}, node {node}) up on rails "
            f"{[str(ip) for ip in rail_ips]}" + (f" in netns {netns}" if netns else "")
            + (f" (fallback {fallback})" if fallback else ""))


def parse_group_up(line: str) -> list[str] | None:
    """The rail addresses of a group-up line, in rail order, or None."""
    m = _GROUP_UP.search(line)
    if not m:
        return None
    return [x.strip(" '\"") for x in m["rails"].strip("[]").split(",") if x.strip()]
