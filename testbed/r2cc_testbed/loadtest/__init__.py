"""Load tests: tail latency of vLLM under scheduled faults, measured with `vllm bench serve`.

    r2cc loadtest list                                   the shipped scenarios (loadtests/scenarios)
    r2cc loadtest run loadtests/scenarios/X.yaml [--quick] [--out DIR]
    r2cc loadtest report DIR                             re-render the report from saved results

Parts: scenario.py (the YAML), bench_serve.py (`vllm bench serve` argv and its result file),
controller.py + schedule_daemon.py (faults applied on schedule by a real-time process, through
faults/inprocess_executor.py), sampler.py (/metrics and NIC counters every 0.5 s), rounds.py (one round),
runner.py (a scenario: deployments, interleaved rounds), intervals.py (bootstrap intervals of
overheads), analysis.py, figures.py, report.py.
"""
