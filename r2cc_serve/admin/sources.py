"""Where the admin API finds the control agents of a group's ranks.

    StatusDirSource  status files on this host (standalone `r2cc admin`)
    VllmSource       vLLM's worker RPC, which reaches every worker on every node

`agents_now()` answers without the event loop (called from the view's poller thread); it
returns None when only the async `agents()` can (VllmSource before its first answer).
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass


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
    """Every `<group>-rank<r>.json` in a status directory (R2CC_STATUS_DIR)."""

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
                out.append(AgentRef(st["agent_address"], st["agent_token"], st["group"], int(st["rank"])))
            except (OSError, ValueError, KeyError):
                continue  # being rewritten or not ours: the next refresh sees it
        return out


class VllmSource:
    """Asks every vLLM worker (all nodes) for its agents through `collective_rpc`."""

    METHOD = "r2cc_agents"  # added to vLLM's worker class by the r2cc plugin

    def __init__(self, engine_client):
        self.engine_client = engine_client
        self._cached: list[AgentRef] | None = None

    def agents_now(self) -> list[AgentRef] | None:
        return self._cached

    async def agents(self) -> list[AgentRef]:
        if self._cached:
            return self._cached
        replies = await self.engine_client.collective_rpc(self.METHOD, timeout=10)
        agents = [AgentRef(**a) for reply in replies for a in (reply or [])]
        if agents:
            self._cached = agents
        return agents

    def forget(self) -> None:
        self._cached = None
