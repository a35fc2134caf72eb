"""The fault lab: network namespaces as servers, veth interfaces as rails.

    from r2cc_serve.lab import Lab, LabError
    lab = Lab.up(hosts=2, rails=4, rate="1gbit")

Modules: netns (run ip/tc/nft), layout (names/addresses), topology (build/teardown), shaping
(tbf), faults, status, state (state file), probe (ICMP from a namespace), cli (`r2cc lab`).
"""

from r2cc_serve.lab.lab import Lab
from r2cc_serve.lab.netns import LabError

__all__ = ["Lab", "LabError"]
