"""Runs last (file order): every deployment of the session left nothing behind."""

from __future__ import annotations

import glob
import os

from r2cc_testbed.lab import netns
from r2cc_testbed.serving.procs import session_pids
from tests.e2e.conftest import PREFIX


def test_no_processes_shm_tmpdirs_or_namespaces_left(session):
    for dep in session.deployments:
        assert dep.leftovers == [], f"{dep.shape}/{dep.backend}: {dep.leftovers}"
        for p in dep.procs:
            assert session_pids(p.sid) == [], f"{dep.shape}/{dep.backend} {p.name} still has processes"
        assert not os.path.exists(dep.run_dir), f"{dep.run_dir} (TMPDIRs, status) was not removed"
        # Only our runs' segments: other people may run vLLM on this machine.
        shm = [p for i in dep.dist_ids for p in glob.glob(f"/dev/shm/vllm_dist_{i}*")]
        assert shm == [], f"{dep.shape}/{dep.backend} left {shm}"
    session.close_lab()
    assert [n for n in netns.list_netns() if n.startswith(f"{PREFIX}-")] == []
