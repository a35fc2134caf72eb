"""How the admin API in vLLM's server finds every rank's control agent: both ends of one RPC.

    worker_agents  runs in each worker (vLLM's collective_rpc, under METHOD): its agents
    VllmSource     the admin view's source in the API server: asks every worker on every node
"""

from __future__ import annotations

from r2cc_serve.admin.sources import AgentRef

METHOD = "r2cc_agents"  # added to vLLM's worker class by the r2cc plugin (plugin.py)


def worker_agents(worker) -> list[dict]:
    """Runs in a worker (collective_rpc): this process's r2cc control agents."""
    from r2cc_serve.comm import registry

    out = []
    for e in registry.entries():
        agent = getattr(e.comm, "agent", None)
        if agent is not None:
            out.append({"address": agent.address, "token": agent.token, "group": e.group, "rank": e.global_rank})
    return out


class VllmSource:
    """Asks every vLLM worker (all nodes) for its agents through `collective_rpc`."""

    METHOD = METHOD

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
