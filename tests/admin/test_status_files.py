"""Status files of dead ranks are recognised and removed; live ones (even stopped) are kept."""

import json
import os
import signal
import subprocess
import sys
import time

from r2cc_serve.admin.sources import StatusDirSource
from r2cc_serve.health.liveness import process_alive, process_identity


def _write(dirpath, name, identity):
    path = os.path.join(dirpath, name)
    with open(path, "w") as f:
        json.dump({"agent_address": "127.0.0.1:1", "agent_token": "t", "group": "g", "rank": 0,
                   "process": identity}, f)
    return path


def test_dead_ranks_file_is_ignored_and_removed_live_and_stopped_ones_kept(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        from r2cc_serve.health import liveness

        ident = {"pid": child.pid, "start": liveness._start_ticks(child.pid)}
        live = _write(tmp_path, "g-rank0.json", ident)
        mine = _write(tmp_path, "g-rank1.json", process_identity())
        os.kill(child.pid, signal.SIGSTOP)  # a stopped rank is alive: its file stays
        assert len(StatusDirSource(str(tmp_path)).agents_now()) == 2
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        assert not process_alive(ident)
        agents = StatusDirSource(str(tmp_path)).agents_now()
        assert len(agents) == 1 and not os.path.exists(live) and os.path.exists(mine)
    finally:
        if child.poll() is None:
            child.kill()


def test_reused_pid_is_not_mistaken_for_the_writer():
    me = process_identity()
    assert process_alive(me)
    assert not process_alive({"pid": me["pid"], "start": me["start"] + 1})


def test_old_file_without_identity_is_a_leftover(tmp_path):
    path = _write(tmp_path, "g-rank0.json", None)
    assert len(StatusDirSource(str(tmp_path)).agents_now()) == 1
    old = time.time() - 3600
    os.utime(path, (old, old))
    assert StatusDirSource(str(tmp_path)).agents_now() == [] and not os.path.exists(path)
