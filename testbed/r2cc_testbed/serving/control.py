"""Operator actions on a running deployment through r2cc's per-rank control agents.

Each r2cc rank runs a control agent (r2cc_serve/control/agent.py) and writes its address
and bearer token into its 0600 status file `$R2CC_STATUS_DIR/<group>-rank<r>.json`.
On the lab, TP rank r runs on host r in both deployment shapes, so "host h" is rank h.
"""

from __future__ import annotations

import time

import httpx

from r2cc_serve.errors import UserError
from r2cc_testbed.serving import evidence

ACTION_TIMEOUT_S = 10.0


def agent_of_rank(status_dir: str | None, rank: int, group: str = "tp:0", wait_s: float = 10.0) -> tuple[str, str]:
    """(address, token) of rank's control agent; UserError if it has not written its status file."""
    if not status_dir:
        raise UserError("drain needs the deployment's R2CC_STATUS_DIR (run with the r2cc backend)")
    deadline = time.monotonic() + wait_s
    while True:
        for doc in evidence.read_status(status_dir).values():
            if doc.get("group") == group and doc.get("rank") == rank and doc.get("agent_address"):
                return doc["agent_address"], doc["agent_token"]
        if time.monotonic() > deadline:
            raise UserError(f"no r2cc control agent of {group} rank {rank} in {status_dir}: is the deployment "
                            "running with --distributed-backend r2cc and a status directory?")
        time.sleep(0.2)


def rail_action(status_dir: str | None, rank: int, rail: int, action: str) -> dict:
    """POST /rails/<rail>/<action> (drain, undrain, failover, restore) to rank's agent."""
    address, token = agent_of_rank(status_dir, rank)
    try:
        r = httpx.post(f"http://{address}/rails/{rail}/{action}", headers={"Authorization": f"Bearer {token}"},
                       timeout=ACTION_TIMEOUT_S, trust_env=False)
    except httpx.HTTPError as exc:
        raise UserError(f"{action} of rail{rail} on rank {rank}: agent {address} did not answer ({exc})") from exc
    if r.status_code != 200:
        raise UserError(f"{action} of rail{rail} on rank {rank}: agent answered HTTP {r.status_code}: {r.text[:200]}")
    return r.json()
