"""The test bed: everything that measures and exercises r2cc, none of which a serving fleet runs.

    faults.py   the one fault model: kinds, text forms (h0:1:down), schedules
    lab/        the fault lab: network namespaces as servers, veth rails, real faults (`r2cc lab`)
    model/      the tiny generated Llama that every serving test loads (`r2cc model make`)
    bench/      collectives against gloo, gloo over MPTCP and Open MPI (`r2cc bench`)
    serving/    vLLM deployments on the lab, the demo, serve-bench (`r2cc demo`, `r2cc serve-bench`)
    loadtest/   tail latency under scheduled faults with `vllm bench serve` (`r2cc loadtest`)

The runtime (comm, sched, health, control, admin, vllm) never imports from here.
"""
