"""`r2cc observe`: what an operator's Prometheus sees of r2cc on the lab, start to finish.

    r2cc observe [--out dashboard.png] [--quiet-s 60] [--down-s 30]

Steps (each printed as it happens): the lab (2 hosts x 4 rails at 1gbit), the tiny model,
vLLM TP=2 on two nodes with --distributed-backend r2cc, a Prometheus server with the shipped
alert rules (1 s scrape and evaluation) scraping it, then, under a greedy streaming load:
  1. a fault-free stretch: which alerts fired (none should)
  2. a 50 ms link flap of rail 0 on host 0: which alerts fired (none should: r2cc hides it)
  3. rail 0 of host 0 down for --down-s: seconds to R2ccRailDown firing, then to resolved
  4. every dashboard query checked, and the panels drawn from the live series into --out
Everything started is stopped and removed at the end, also on Ctrl-C.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from r2cc_serve.errors import UserError
from r2cc_testbed.results import check_out, write_result

FIRE_TIMEOUT_S = 60.0


def _say(msg: str) -> None:
    print(f"[observe] {msg}", file=sys.stderr, flush=True)


class _Load:
    """Greedy streams in a background thread until stop()."""

    def __init__(self, dep, seconds: float):
        from r2cc_testbed.serving.load import LoadSpec, run_load

        spec = LoadSpec(max_tokens=32, concurrency=4, duration_s=seconds, deadline_s=seconds + 300)
        self.result = None
        self._thread = threading.Thread(target=lambda: setattr(self, "result", run_load(dep.url, dep.model, spec)),
                                        daemon=True)
        self._thread.start()

    def join(self) -> dict:
        self._thread.join(timeout=900)
        return self.result.summary() if self.result else {"failed": "the load did not finish"}


def _r2cc_firing(prom) -> list[dict]:
    return [a for a in prom.firing() if a["alertname"].startswith("R2cc")]


def _fired_between(prom, start: float) -> list[str]:
    window = int(time.time() - start) + 2
    got = prom.query(f'count_over_time(ALERTS{{alertname=~"R2cc.*", alertstate="firing"}}[{window}s])')
    return sorted({f"{s['metric']['alertname']} {s['metric'].get('host', '')} rail{s['metric'].get('rail', '-')}"
                   for s in got})


def _wait_for(prom, want: bool, t0: float, timeout_s: float) -> float | None:
    def down_alert() -> bool:
        return any(a["alertname"] == "R2ccRailDown" and a.get("host") == "node0" and a.get("rail") == "0"
                   for a in prom.firing())
    while time.time() - t0 < timeout_s:
        if down_alert() == want:
            return time.time() - t0
        time.sleep(0.25)
    return None


def run(args) -> int:
    from r2cc_testbed.lab.session import lab_session
    from r2cc_testbed.observe import dashboard
    from r2cc_testbed.observe.prometheus import PrometheusServer
    from r2cc_testbed.serving.deploy import two_nodes
    from r2cc_testbed.serving.model_dir import temp_model

    if args.quiet_s < 10 or args.down_s < 15:
        raise UserError("--quiet-s must be at least 10 and --down-s at least 15 (the rule waits 10 s)")
    check_out(args.out, "observe")
    report, marks = {}, {}
    with lab_session(2, 4, "1gbit") as lab, temp_model("float32") as model:
        _say("vLLM TP=2 on two lab hosts, --distributed-backend r2cc (1-3 min on a small box)")
        with two_nodes(lab, model, backend="r2cc", port=args.port, extra_args=("--dtype", "float32"),
                       extra_env={"R2CC_ADMIN_TOKEN": "observe"}) as dep:
            target = dep.url.removeprefix("http://")
            with PrometheusServer([target], interval_s=1.0) as prom:
                _say(f"Prometheus at {prom.url} scrapes {target} every second with the shipped alert rules")
                since = time.time()
                total = args.quiet_s + 30 + args.down_s + 40
                load = _Load(dep, total)
                time.sleep(5)
                _say(f"1/4 fault-free for {args.quiet_s:g} s")
                t = time.time()
                time.sleep(args.quiet_s)
                report["fault_free_alerts"] = _fired_between(prom, t)
                _say(f"    alerts fired: {report['fault_free_alerts'] or 'none'}")
                _say("2/4 a 50 ms flap of rail 0 on host 0, then 30 s of watching")
                t = marks["50 ms flap"] = time.time()
                lab.fault(0, 0, "flap", (100, 1))
                time.sleep(30)
                report["flap_alerts"] = _fired_between(prom, t)
                _say(f"    alerts fired: {report['flap_alerts'] or 'none'}")
                _say(f"3/4 rail 0 of host 0 down for {args.down_s:g} s")
                t = marks["rail 0 down"] = time.time()
                lab.fault(0, 0, "down")
                try:
                    report["fired_after_s"] = _wait_for(prom, True, t, min(FIRE_TIMEOUT_S, args.down_s))
                    _say(f"    R2ccRailDown firing after {_s(report['fired_after_s'])}")
                    time.sleep(max(0.0, args.down_s - (time.time() - t)))
                finally:
                    lab.fault(0, 0, "up")
                t = marks["up"] = time.time()
                report["resolved_after_s"] = _wait_for(prom, False, t, FIRE_TIMEOUT_S)
                _say(f"    resolved {_s(report['resolved_after_s'])} after the link came back")
                report["load"] = load.join()
                end = time.time()
                _say("4/4 the dashboard's queries and panels")
                problems = {k: v for k, v in dashboard.check(prom, since, end).items() if v}
                report["dashboard_problems"] = problems
                png = os.path.join(args.out, "r2cc-dashboard.png")
                dashboard.render(prom, since, end, png, marks=marks)
                _say(f"    drew {len(dashboard.panels())} panels into {png}"
                     + (f"; queries without data: {problems}" if problems else "; every query returned series"))
    _print(report)
    _say(f"wrote {write_result(args.out, 'observe', report)}")
    ok = (not report["fault_free_alerts"] and not report["flap_alerts"] and report["fired_after_s"] is not None
          and report["resolved_after_s"] is not None and not report["dashboard_problems"]
          and not report["load"].get("failed"))
    return 0 if ok else 1


def _s(x) -> str:
    return "never" if x is None else f"{x:.1f} s"


def _print(r: dict) -> None:
    print("\nr2cc observe: Prometheus 1 s scrape and evaluation, configs/prometheus/r2cc-alerts.yaml")
    print(f"fault-free stretch : alerts fired: {', '.join(r['fault_free_alerts']) or 'none'}")
    print(f"50 ms rail flap    : alerts fired: {', '.join(r['flap_alerts']) or 'none'}")
    print(f"rail down          : R2ccRailDown firing after {_s(r['fired_after_s'])}, resolved "
          f"{_s(r['resolved_after_s'])} after the rail returned")
    print(f"load               : {r['load'].get('ok')} requests ok, {r['load'].get('failed')} failed")
    print("dashboard          : " + ("every panel's queries returned series" if not r["dashboard_problems"]
                                      else f"queries without data: {r['dashboard_problems']}"))


def register(sub) -> None:
    p = sub.add_parser("observe", help="Prometheus with r2cc's alert rules on a live deployment: a flap, a "
                                       "rail down, the alerts, the dashboard drawn",
                       description=__doc__.split("\n")[0])
    p.add_argument("--out", metavar="DIR", default=".",
                   help="results folder: the dashboard's panels go to DIR/r2cc-dashboard.png and the report to "
                        "DIR/observe.json (default: the current folder)")
    p.add_argument("--quiet-s", type=float, default=60.0, help="seconds of fault-free load first (default 60)")
    p.add_argument("--down-s", type=float, default=30.0, help="seconds rail 0 of host 0 stays down (default 30)")
    p.add_argument("--port", type=int, default=8480, help="vLLM's port on the lab (default 8480)")
    p.set_defaults(func=run)
