"""Both ends of the RPC by which the admin API in vLLM's server finds the workers' agents."""

import asyncio
from types import SimpleNamespace

from r2cc_serve.admin.sources import AgentRef
from r2cc_serve.comm import registry
from r2cc_serve.vllm.agents import METHOD, VllmSource, worker_agents


def test_each_worker_names_its_agents_and_the_source_asks_every_worker():
    agent = SimpleNamespace(address="10.0.0.1:7000", token="t")
    registry.register("tp:0", 5, 1, SimpleNamespace(agent=agent))
    registry.register("tp:1", 6, 1, SimpleNamespace(agent=None))  # control off: no agent to name
    try:
        mine = worker_agents(worker=None)
    finally:
        registry.unregister("tp:0")
        registry.unregister("tp:1")
    assert mine == [{"address": "10.0.0.1:7000", "token": "t", "group": "tp:0", "rank": 5}]

    calls = []

    class Engine:
        async def collective_rpc(self, method, timeout):
            calls.append(method)
            return [mine, None]  # a worker without r2cc groups answers None

    source = VllmSource(Engine())
    assert source.agents_now() is None  # nothing asked yet: only the async call can answer
    got = asyncio.run(source.agents())
    assert got == [AgentRef("10.0.0.1:7000", "t", "tp:0", 5)] and source.agents_now() == got
    asyncio.run(source.agents())
    assert calls == [METHOD]  # cached until forgotten (a retry re-forms the groups)
    source.forget()
    assert source.agents_now() is None
