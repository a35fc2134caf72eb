"""vLLM serving on the fault lab: deployments, a streaming load client, faults during generation.

    deploy.py             single_instance (a) / two_nodes (b) context managers; always cleaned up
    vllm_env.py           environment and `vllm serve` command line of one node, per backend
    procs.py              processes in their own sessions, stopped for sure
    load.py               streaming greedy load with token ids, TTFT, inter-token times
    fault_experiment.py   a load with one fault (down, blackhole, flap, drain, all-down) held in it,
                          and its verdict (same tokens, no failures, failover seen, recovered)
    outage_experiment.py  `r2cc serve-outage`: every rail of a host down while requests decode
    control.py            drain/undrain through the r2cc ranks' control agents
    evidence.py           rail transitions from logs and status files
    demo.py               `r2cc demo`
    serve_bench.py        `r2cc serve-bench`: decode tokens/s and TPOT, r2cc against vLLM's default backend
    serve_prefill.py      `r2cc serve-prefill`: long prompts with a degraded host, planner against direct
    admin_latency.py      `r2cc admin probe-latency`: how fast the admin API answers under load
    model_dir.py          the tiny model in a temp dir
    cli.py                registers demo, serve-bench and serve-prefill
"""
