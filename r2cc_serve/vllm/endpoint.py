"""vLLM endpoint plugin: the admin API and r2cc metrics inside vLLM's own API server.

Enabled by the r2cc general plugin when `--distributed-backend r2cc` is given (it adds
`r2cc_admin` to VLLM_PLUGINS). Rank agents are found through vLLM's worker RPC, so
every worker on every node is reached; their rail metrics are added to vLLM's /metrics.
"""

from __future__ import annotations

import asyncio
import logging

from r2cc_serve import envs
from r2cc_serve.vllm import compat
from r2cc_serve.admin.app import AdminState, build_router
from r2cc_serve.admin.auth import NO_TOKEN, configured_read_token, token_or_reason
from r2cc_serve.util.priority import raise_process_priority
from r2cc_serve.vllm.agents import VllmSource

log = logging.getLogger("r2cc_serve.admin")


class R2CCAdminEndpoint:
    name = "r2cc_admin"
    required_tasks = None

    def __init__(self):
        token, why = token_or_reason()
        if token is None and why != NO_TOKEN:
            # Not a reason to stop serving: reads work, mutations answer 403 with this reason.
            log.error("r2cc admin: %s; drain/failover answer 403 until it is fixed and vLLM restarted", why)
        self.state = AdminState(token=token, why_no_token=why,  # why is "" when there is a token
                                read_token=configured_read_token())

    def attach_router(self, app) -> None:
        app.include_router(build_router(self.state))

    async def init_state(self, engine_client, state, args) -> None:
        # Before anything else (also without an engine): vLLM serves no request before this.
        self.state.api_keys = compat.api_keys(args)
        if engine_client is None:
            return
        from r2cc_serve.admin.metrics import R2CCCollector

        done = raise_process_priority(envs.get("R2CC_API_SERVER_NICE"))
        (log.warning if done.startswith("not changed") else log.info)("r2cc admin: API server priority: %s", done)
        self.state.view.source = VllmSource(engine_client)
        compat.prometheus_registry().register(R2CCCollector(self.state.view,
                                                            mutations_enabled=self.state.token is not None))
        # Poll from now on, so /metrics has the workers' rails before anyone calls /r2cc/v1.
        self.state.view.start(asyncio.get_running_loop())
        if self.state.token is None:
            log.warning("r2cc admin: no R2CC_ADMIN_TOKEN set: /r2cc/v1 reads work, drain/failover answer 403")
        if not self.state.read_tokens():
            log.warning("r2cc admin: /r2cc/v1 reads (rails, health, events, plan) are open to anyone who reaches "
                        "this port; set R2CC_ADMIN_READ_TOKEN or vLLM's --api-key to close them")
        if getattr(args, "enable_fault_tolerance", False):
            from r2cc_serve.vllm import fault_tolerance

            auto = envs.get("R2CC_FT_AUTO_RETRY")
            # A retry re-forms the groups, with new control agents: the view must ask the workers again.
            # Kept on self: the event loop holds tasks only weakly.
            self.ft_task = asyncio.get_running_loop().create_task(fault_tolerance.watch_engine(
                engine_client, lambda rid: compat.fault_tolerance_request("retry", rid), auto_retry=auto,
                on_resumed=self.state.view.source.forget))
            log.warning("r2cc: --enable-fault-tolerance: an r2cc group that gives up is %s",
                        f"retried automatically every {envs.get('R2CC_FT_RETRY_INTERVAL_S'):g} s until a rail is back"
                        if auto else "left to POST /fault_tolerance/apply (R2CC_FT_AUTO_RETRY=0)")
