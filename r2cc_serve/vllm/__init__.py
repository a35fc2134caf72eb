"""Everything r2cc does inside vLLM, and the only place that knows vLLM's internals.

    compat.py        every vLLM internal r2cc touches, behind small functions; the pinned version
    plugin.py        the `vllm.general_plugins` entry point: --distributed-backend, the hook
    communicator.py  R2CCCommunicator, vLLM's DeviceCommunicatorBase on an r2cc Communicator
    endpoint.py      the `vllm.endpoint_plugins` entry point: the admin API and metrics in vLLM's server
    agents.py        how that admin API finds every worker's control agents (vLLM's worker RPC)
    step_share.py    serve-bench's clocks: each worker's time inside collectives per step, any backend
"""
