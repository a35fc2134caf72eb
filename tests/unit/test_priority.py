"""Priority raises (API server process, control threads), on real processes with several threads."""

import json
import os
import subprocess
import sys

import pytest

CHILD = r"""
import json, os, threading, time
from r2cc_serve.util.priority import raise_process_priority
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


@pytest.mark.requires("root")  # raising a priority needs root
def test_every_thread_old_and_new_gets_the_priority():
    got = _child(-7)
    assert got["threads"] >= 3 and got["nices"] == [-7], got
    assert got["done"].startswith("nice -7 on"), got


def test_zero_leaves_the_priority_alone():
    got = _child(0)
    assert got["nices"] == [os.getpriority(os.PRIO_PROCESS, 0)] and "left as is" in got["done"], got


THREAD_CHILD = r"""
import json, os, threading
from r2cc_serve.util.priority import raise_thread_priority
stop = threading.Event()
bystander = threading.Thread(target=stop.wait); bystander.start()
out = {}
def control():
    out["done"] = raise_thread_priority(int(os.environ["NICE"]))
    child = threading.Thread(target=stop.wait); child.start()   # started by the raised thread
    out["child"] = os.getpriority(os.PRIO_PROCESS, child.native_id)
    out["self"] = os.getpriority(os.PRIO_PROCESS, 0)
t = threading.Thread(target=control); t.start(); t.join()
out["bystander"] = os.getpriority(os.PRIO_PROCESS, bystander.native_id)
out["main"] = os.getpriority(os.PRIO_PROCESS, 0)
stop.set()
print(json.dumps(out))
"""


@pytest.mark.requires("root")  # raising a priority needs root
def test_a_control_thread_and_what_it_starts_get_the_priority_and_nothing_else():
    out = subprocess.run([sys.executable, "-c", THREAD_CHILD], env=dict(os.environ, NICE="-6"),
                         capture_output=True, text=True, timeout=60, check=True)
    got = json.loads(out.stdout)
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert got["done"] == "nice -6" and got["self"] == -6 and got["child"] == -6, got
    assert got["bystander"] == base and got["main"] == base, got
