"""The API server's priority raise, on a real process with several threads."""

import json
import os
import subprocess
import sys

import pytest

CHILD = r"""
import json, os, threading, time
from r2cc_serve.admin.priority import raise_process_priority
stop = threading.Event()
before = threading.Thread(target=stop.wait); before.start()   # exists when the priority is raised
done = raise_process_priority(int(os.environ["NICE"]))
after = threading.Thread(target=stop.wait); after.start()     # made afterwards: inherits it
nices = {t: os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")}
stop.set()
print(json.dumps({"done": done, "nices": sorted(set(nices.values())), "threads": len(nices)}))
"""


def _child(nice: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD], env=dict(os.environ, NICE=str(nice)),
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(os.geteuid() != 0, reason="raising a priority needs root")
def test_every_thread_old_and_new_gets_the_priority():
    got = _child(-7)
    assert got["threads"] >= 3 and got["nices"] == [-7], got
    assert got["done"].startswith("nice -7 on"), got


def test_zero_leaves_the_priority_alone():
    got = _child(0)
    assert got["nices"] == [os.getpriority(os.PRIO_PROCESS, 0)] and "left as is" in got["done"], got
