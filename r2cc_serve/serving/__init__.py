"""vLLM serving on the fault lab: deployments, a streaming load client, faults during generation.

    deploy.py        single_instance (a) / two_nodes (b) context managers; always cleaned up
    vllm_env.py      environment and `vllm serve` command line of one node
    procs.py         processes in their own sessions, stopped for sure
    labctx.py        a lab for the duration of a run, never someone else's
    load.py          streaming greedy load with token ids, TTFT, inter-token times
    faults.py        one rail fault (down, blackhole, flap, drain, all-down) during a load
    control.py       drain/undrain through the r2cc ranks' control agents
    evidence.py      rail transitions from logs and status files
    scenario.py      fault run + verdict (same tokens, no failures, failover seen, recovered)
    demo.py          `r2cc demo`
    bench_decode.py  `r2cc serve-bench`: decode tokens/s and TPOT, r2cc vs default
    model_dir.py     the tiny model in a temp dir
    cli.py           registers demo and serve-bench
"""
