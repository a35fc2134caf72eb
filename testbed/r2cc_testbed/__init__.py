"""The test bed: everything that measures and exercises r2cc, none of which a serving fleet runs.

    faults/     the one fault model (kinds, text forms: h0:1:down), how faults are applied, timed faults
    lab/        the fault lab: network namespaces as servers, veth rails, real faults (`r2cc lab`)
    model/      the tiny generated Llama that every serving test loads (`r2cc model make`)
    bench/      collectives against gloo, gloo over MPTCP and Open MPI (`r2cc bench`)
    serving/    vLLM deployments on the lab, the demo, serve-bench (`r2cc demo`, `r2cc serve-bench`)
    loadtest/   tail latency under scheduled faults with `vllm bench serve` (`r2cc loadtest`)

The runtime (r2cc_serve: comm, sched, health, control, admin, vllm) never imports from here; this
is a package of its own (testbed/pyproject.toml), so a serving host installs the runtime alone.
"""

from __future__ import annotations

import os

import r2cc_serve

# Where each package is imported from (a checkout, or site-packages). Processes the test bed
# starts (ranks, vLLM nodes, responders) get both on PYTHONPATH and so run this process's code,
# whatever an editable install points at. In a checkout PROJECT_ROOT also holds loadtests/ and
# configs/.
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(r2cc_serve.__file__)))
TESTBED_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_pythonpath(existing: str | None = None) -> str:
    """PYTHONPATH for a process the test bed starts: both packages' roots, then `existing`."""
    return os.pathsep.join(dict.fromkeys(p for p in (PROJECT_ROOT, TESTBED_ROOT, existing) if p))

