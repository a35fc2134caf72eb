"""serve-bench's CPU per token: the CPU seconds of a deployment's process sessions, from /proc."""

from __future__ import annotations

import subprocess
import sys
import time

from r2cc_testbed.serving.procs import sessions_cpu_s

BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\ntime.sleep(30)"


def test_counts_the_cpu_a_session_burns_and_nothing_else():
    busy = subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True)
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        deadline = time.time() + 30
        while sessions_cpu_s([busy.pid]) < 0.6 and time.time() < deadline:
            time.sleep(0.1)
        assert 0.6 <= sessions_cpu_s([busy.pid]) < 5, "the busy session's 0.6 s of CPU (plus start-up)"
        assert sessions_cpu_s([idle.pid]) < 0.6, "a sleeping session burns (almost) none"
        assert sessions_cpu_s([busy.pid, idle.pid]) >= sessions_cpu_s([busy.pid])
        assert sessions_cpu_s([]) == 0
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()
