"""A peer whose process is gone is told apart from rails that are down (loopback, no root).

The transport decides from why each rail failed (csrc/net.h IoCause: the peer's host refused,
reset or closed the connection), not from the words of the rail's last error.
"""

import pytest

from tests.comm import peer_gone_workers
from tests.comm.harness import run_ranks


# victim 1: the survivor (rank 0) only accepts, and sees its connections closed or reset;
# victim 0: the survivor (rank 1) dials its rails again, and the dead rank's host refuses.
@pytest.mark.parametrize("victim", [1, 0])
def test_a_dead_peer_process_raises_peer_gone(victim):
    res = run_ranks(peer_gone_workers.peer_process_dies, 2, victim, timeout=150)
    survivor = res[1 - victim]
    assert res[victim]["victim"] and res[victim]["exitcode"] == 0, res
    assert survivor["raised"] == "PeerGoneError" and survivor["kind"] == "peer_gone", survivor
    assert survivor["msg"].startswith("r2cc: a rank's process is gone"), survivor
    assert survivor["after_s"] < 15, survivor  # the grace period (0.6 s) plus detection, on a busy box
