"""Rail bandwidth shaping with tbf, so the network (not the 2-core CPU) is the bottleneck."""

from __future__ import annotations

from r2cc_testbed.lab import netns
from r2cc_testbed.lab.layout import SHAPING_BURST, SHAPING_LATENCY, Layout


def shape_args(dev: str, rate: str) -> list[str]:
    """tc arguments that set (or change) the root tbf of dev's egress to rate."""
    return ["qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
            "burst", SHAPING_BURST, "latency", SHAPING_LATENCY]


def shape(ns: str, dev: str, rate: str) -> None:
    """Set (or change) the root tbf of dev's egress to rate."""
    netns.tc(ns, *shape_args(dev, rate))


def unshape(ns: str, dev: str) -> None:
    """Remove a root tbf if there is one (idempotent)."""
    if root_qdisc(ns, dev).get("kind") == "tbf":
        netns.tc(ns, "qdisc", "del", "dev", dev, "root")


def root_qdisc(ns: str, dev: str) -> dict:
    """The root qdisc of dev as tc reports it ({} if none)."""
    for qdisc in netns.tc_json(ns, "qdisc", "show", "dev", dev):
        if qdisc.get("root"):
            return qdisc
    return {}


def describe(qdisc: dict) -> dict | None:
    """JSON-able summary of a root qdisc: None when unshaped, else kind and rate in bit/s."""
    if qdisc.get("kind") != "tbf":
        return None
    options = qdisc.get("options", {})
    rate_bytes = options.get("rate64") or options.get("rate", 0)  # tc -j reports bytes/s
    return {"kind": "tbf", "rate_bit": int(rate_bytes) * 8, "burst_bytes": options.get("burst")}


def set_link_rate(layout: Layout, host: int, rail: int, rate: str | None) -> None:
    """Shape both directions of host's rail link to rate; rate None removes shaping."""
    for ns, dev in layout.link_ends(host, rail):
        if rate is None:
            unshape(ns, dev)
        else:
            shape(ns, dev, rate)
