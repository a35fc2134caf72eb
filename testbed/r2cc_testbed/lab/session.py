"""Bring the fault lab up for a serving run and take it down afterwards, also on errors.

Several people share this machine, each with a lab prefix of their own; labs with
non-default prefixes share one subnet (layout.py), so two of them cannot be up at once. We
therefore never tear down a lab we did not build: an existing lab with our prefix is an
error (unless reuse=True), and a lab holding our subnet is waited for.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Iterator

from r2cc_serve.errors import UserError
from r2cc_testbed.lab import netns
from r2cc_testbed.lab.lab import Lab
from r2cc_testbed.lab.netns import LabError


@contextlib.contextmanager
def _env(prefix: str | None, state: str | None) -> Iterator[None]:
    """R2CC_LAB_PREFIX/R2CC_LAB_STATE for the Lab API calls, restored afterwards."""
    saved = {k: os.environ.get(k) for k in ("R2CC_LAB_PREFIX", "R2CC_LAB_STATE")}
    if prefix:
        os.environ["R2CC_LAB_PREFIX"] = prefix
    if state:
        os.environ["R2CC_LAB_STATE"] = state
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _our_namespaces(prefix: str) -> list[str]:
    return [n for n in netns.list_netns() if n.startswith(f"{prefix}-h") or n == f"{prefix}-sw"]


@contextlib.contextmanager
def lab_session(hosts: int = 2, rails: int = 4, rate: str | None = "1gbit", *, prefix: str | None = None,
                state: str | None = None, keep: bool = False, reuse: bool = False,
                wait_s: float = 0.0, mtu: int = 1500) -> Iterator[Lab]:
    """A lab for the duration of the block; removed at exit unless keep (or it was reused).

    wait_s: how long to wait while another lab holds the subnet (LabError after that).
    """
    prefix = prefix or os.environ.get("R2CC_LAB_PREFIX") or "r2cc"
    # Lab.up also removes the lab its state file records: a state file of our own keeps
    # that from ever being someone else's lab.
    state = state or os.environ.get("R2CC_LAB_STATE") or (
        None if prefix == "r2cc" else f"/run/r2cc-lab/{prefix}-state.json")
    with _env(prefix, state):
        _check_state_file_is_ours(prefix)
        existing = _our_namespaces(prefix)
        built = False
        if existing:
            if not reuse:
                raise UserError(f"a lab with prefix {prefix!r} is already up ({', '.join(existing)}); "
                                "take it down with `r2cc lab down`, reuse it, or set R2CC_LAB_PREFIX")
            lab = Lab.load()
            if lab.hosts < hosts or lab.rails != rails:
                raise UserError(f"the lab that is up has {lab.hosts} hosts x {lab.rails} rails; "
                                f"this run needs {hosts} x {rails}")
        else:
            lab = _up_waiting(hosts, rails, rate, mtu, wait_s)
            built = True
    try:
        yield lab
    finally:
        if built and not keep:
            with _env(prefix, state):
                Lab.down()


def _check_state_file_is_ours(prefix: str) -> None:
    from r2cc_testbed.lab import state as lab_state

    with contextlib.suppress(LabError):
        recorded = lab_state.read()
        other = (recorded or {}).get("prefix")
        if other and other != prefix and _our_namespaces(other):
            raise UserError(f"the lab state file {lab_state.state_path()} describes the running lab {other!r}, "
                            f"not {prefix!r}; set R2CC_LAB_STATE to a file of your own")


def _up_waiting(hosts: int, rails: int, rate: str | None, mtu: int, wait_s: float) -> Lab:
    deadline = time.monotonic() + wait_s
    noted = False
    while True:
        try:
            return Lab.up(hosts=hosts, rails=rails, rate=rate, mtu=mtu)
        except LabError as exc:
            if "already used" not in str(exc) or time.monotonic() > deadline:
                raise
            if not noted:
                print(f"[lab] waiting up to {wait_s:.0f} s for another lab to free the subnet: {exc}",
                      file=sys.stderr, flush=True)
                noted = True
            time.sleep(5)
