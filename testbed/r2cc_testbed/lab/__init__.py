"""The fault lab: network namespaces as servers, veth interfaces as rails.

    from r2cc_testbed.lab import Lab, LabError
    lab = Lab.up(hosts=2, rails=4, rate="1gbit")

Modules: netns (run ip/tc/nft), layout (names/addresses), topology (build/teardown), shaping
(tbf), inject (carry out a fault on the kernel), nft_rules (the rulesets of blackhole, lossy,
gray and marginal), status, state (state file), ping (ICMP from a namespace), mptcp and
baselines (MPTCP endpoints, how the gloo baselines are put on the rails), session (a lab for
the length of a run), cli (`r2cc lab`).
"""

from r2cc_testbed.lab.netns import LabError

__all__ = ["Lab", "LabError"]


def __getattr__(name: str):
    # Lab is imported when first asked for: it applies faults through r2cc_testbed.faults, whose
    # executors are built on this package's modules (layout, netns, nft_rules), so importing it
    # here, before those, would make a circle.
    if name == "Lab":
        from r2cc_testbed.lab.lab import Lab
        return Lab
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
