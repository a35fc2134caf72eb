"""`r2cc demo`, `r2cc serve-bench`, `r2cc serve-prefill`, `r2cc serve-outage`: vLLM on the fault lab
(needs root and vLLM)."""

from __future__ import annotations


def _demo(args) -> int:
    from r2cc_testbed.serving import demo

    return demo.run(args)


def _bench(args) -> int:
    from r2cc_testbed.serving import serve_bench

    return serve_bench.run(args)


def _prefill(args) -> int:
    from r2cc_testbed.serving import serve_prefill

    return serve_prefill.run(args)


def _outage(args) -> int:
    from r2cc_testbed.serving import outage_experiment

    return outage_experiment.run(args)


def register(sub) -> None:
    # Light imports only (httpx, the lab): torch and vLLM are never imported by the CLI process.
    from r2cc_testbed.serving import demo, outage_experiment, serve_bench, serve_prefill

    p = sub.add_parser("demo", help="vLLM TP=2 on two lab hosts; a rail dies mid-stream; report",
                       description=demo.__doc__.split("\n")[0])
    demo.add_arguments(p)
    p.set_defaults(func=_demo)

    b = sub.add_parser("serve-bench", help="decode tokens/s, TPOT and the collective share of a decode step: "
                                           "r2cc vs vLLM's default backend",
                       description=serve_bench.__doc__.split("\n")[0], epilog=serve_bench.SHARE_HELP)
    serve_bench.add_arguments(b)
    b.set_defaults(func=_bench)

    f = sub.add_parser("serve-prefill", help="long-prompt prefill with a degraded host: planner vs forced direct",
                       description=serve_prefill.__doc__.split("\n")[0])
    serve_prefill.add_arguments(f)
    f.set_defaults(func=_prefill)

    o = sub.add_parser("serve-outage", help="every rail of a host down: vLLM with and without --enable-fault-tolerance",
                       description=outage_experiment.__doc__.split("\n")[0])
    outage_experiment.add_arguments(o)
    o.set_defaults(func=_outage)
