"""Run a pytest module inside the guest and read its results back (junit XML on the share).

One boot can run a whole in-guest module; the host reads which cases passed from the XML.
"""

from __future__ import annotations

import shlex
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Sequence

from r2cc_testbed.guest.job import GUEST_OUT

JUNIT = "junit.xml"


def command(paths: Sequence[str], extra: Sequence[str] = ()) -> str:
    """The guest's pytest command: the host's addopts (`-m 'not slow'`) do not apply in there; junit XML
    goes to the share. Paths are relative to the checkout (the guest runs in it)."""
    argv = ["python3", "-m", "pytest", "-o", "addopts=-ra", "-p", "no:cacheprovider", "-v",
            f"--junitxml={GUEST_OUT}/{JUNIT}", *extra, *paths]
    return shlex.join(argv)


@dataclass(frozen=True)
class Case:
    name: str  # "module.Class.test" as junit has it, e.g. tests.rdma.in_guest.test_rails.test_x
    outcome: str  # passed | failed | error | skipped
    message: str = ""


def parse_junit(xml_text: str) -> list[Case]:
    """Every test case in a junit XML report, with its outcome."""
    cases = []
    for tc in ET.fromstring(xml_text).iter("testcase"):
        name = ".".join(p for p in (tc.get("classname"), tc.get("name")) if p)
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = tc.find(tag)
            if node is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = node.get("message") or (node.text or "").strip()[:500]
                break
        cases.append(Case(name, outcome, message))
    return cases
