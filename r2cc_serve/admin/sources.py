"""Where the admin API finds the control agents of a group's ranks.

    StatusDirSource  status files on this host (standalone `r2cc admin`)
    StaticSource     a fixed list
    (r2cc_serve.vllm.agents.VllmSource: vLLM's worker RPC, inside vLLM's API server)

`agents_now()` answers without the event loop (called from the view's poller thread); it
returns None when only the async `agents()` can (VllmSource before its first answer).
"""

from __future__ import annotations

import glob
import json
import logging
import os
import time
from dataclasses import dataclass

from r2cc_serve.health.liveness import process_alive

log = logging.getLogger("r2cc_serve.admin")
LEGACY_STALE_S = 600.0  # a file without its writer's identity is a leftover once this old


@dataclass(frozen=True)
class AgentRef:
    address: str  # host:port
    token: str
    group: str
    rank: int


class StaticSource:
    """A fixed list (tests, or a group with known agents)."""

    def __init__(self, agents: list[AgentRef]):
        self._agents = list(agents)

    def agents_now(self) -> list[AgentRef]:
        return self._agents

    async def agents(self) -> list[AgentRef]:
        return self._agents


class StatusDirSource:
    """Every `<group>-rank<r>.json` in a status directory (R2CC_STATUS_DIR) whose writer still
    runs. A dead rank's leftover (SIGKILL leaves it behind) is removed, not called forever."""

    def __init__(self, directory: str):
        self.directory = directory

    async def agents(self) -> list[AgentRef]:
        return self.agents_now()

    def agents_now(self) -> list[AgentRef]:
        out = []
        for path in sorted(glob.glob(os.path.join(self.directory, "*-rank*.json"))):
            try:
                with open(path) as f:
                    st = json.load(f)
                if self._leftover(path, st):
                    continue
                out.append(AgentRef(st["agent_address"], st["agent_token"], st["group"], int(st["rank"])))
            except (OSError, ValueError, KeyError):
                continue  # being rewritten or not ours: the next refresh sees it
        return out

    @staticmethod
    def _leftover(path: str, st: dict) -> bool:
        ident = st.get("process")
        gone = (not process_alive(ident)) if ident else time.time() - os.path.getmtime(path) > LEGACY_STALE_S
        if gone:
            log.warning("r2cc admin: %s was left by a rank that is gone (%s); removing it", path,
                        f"pid {ident['pid']} no longer runs" if ident else "no update for 10 min")
            try:
                os.unlink(path)
            except OSError:
                pass  # not ours to remove: skipping it is enough
        return gone
