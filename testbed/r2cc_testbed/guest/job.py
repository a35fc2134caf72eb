"""The job a run leaves on the guest's share: what guest_init.sh reads (pure but for writing files).

<out>/.job/ holds init.sh (the guest's init), job.env (paths), rails.sh/rails.env (the
topology), command.sh; the guest adds output.log, rails.log and rc. The rest of <out> is the
command's, as $R2CC_GUEST_OUT (/r2cc-out) in the guest: junit XML, logs.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from typing import Sequence

from r2cc_testbed.guest import topology
from r2cc_testbed.guest.builder import Build

JOB = ".job"
GUEST_OUT = "/r2cc-out"
INIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "guest_init.sh")


def command_text(command: str | Sequence[str]) -> str:
    """A shell command from a string (as is) or an argv (quoted word by word)."""
    return command if isinstance(command, str) else shlex.join(command)


def env_file(values: dict[str, str]) -> str:
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())


def job_env(build: Build, timeout_s: float, python: str = sys.executable) -> dict[str, str]:
    """Where things are for guest_init.sh; PYTHONPATH as the host's tests set it (checkout, testbed)."""
    return {"GUEST_CHECKOUT": build.checkout, "GUEST_CORE_SO": build.core_so, "GUEST_MODULES": build.kernel.modules,
            "GUEST_PATH_PREFIX": os.path.dirname(python),  # this Python (its venv, if any) first
            "GUEST_PYTHONPATH": os.pathsep.join([build.checkout, os.path.join(build.checkout, "testbed")]),
            "GUEST_TIMEOUT_S": str(max(1, round(timeout_s)))}


def write(out_dir: str, build: Build, command: str | Sequence[str], rails: int, timeout_s: float) -> str:
    """Write the job into out_dir/.job (replacing an old one); returns that directory."""
    job = os.path.join(out_dir, JOB)
    shutil.rmtree(job, ignore_errors=True)
    os.makedirs(job)
    files = {"job.env": env_file(job_env(build, timeout_s)), "command.sh": command_text(command) + "\n",
             "rails.sh": topology.setup_script(rails), "rails.env": env_file(topology.env(rails))}
    for name, text in files.items():
        with open(os.path.join(job, name), "w") as f:
            f.write(text)
    shutil.copy(INIT, os.path.join(job, "init.sh"))
    return job
