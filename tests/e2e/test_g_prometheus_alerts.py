"""r2cc as an operator's monitoring sees it: a real Prometheus server (1 s scrape and rule
evaluation) with the shipped alert rules scraping a live two-node vLLM + r2cc deployment on the
lab, while greedy streams decode.

A fault-free minute fires no alert; rail 0 of host 0 going down fires R2ccRailDown for that
rail, and it resolves after the rail returns; every query of the Grafana dashboard parses and
returns series from this Prometheus, and the panels are drawn from them. Everything (the
server, its data, the deployment) is stopped and removed afterwards. The deployment is the
shared r2cc_two_nodes one of conftest.py: Prometheus starts fresh here, so counters raised by
earlier tests show no increase to the rules.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time

import pytest

from r2cc_testbed.observe import dashboard
from r2cc_testbed.observe.prometheus import PrometheusServer
from r2cc_testbed.serving.load import run_load
from tests.e2e.conftest import LOAD

# A fault-free minute is most of its ~2 min: outside the default run, in CI (-m ci).
pytestmark = [pytest.mark.requires("prometheus"), pytest.mark.slow, pytest.mark.ci]
USES_SHARED_DEPLOYMENT = True
FIRE_WITHIN_S = 30.0   # the rule waits 10 s (for:), then a scrape and an evaluation; goal 15 s
RESOLVE_WITHIN_S = 60.0
UP_AGAIN_WITHIN_S = 5.0  # a scrape a second; a set-aside rail is back in ~0.1 s


def _note(msg: str) -> None:
    print(f"[prometheus e2e] {msg}", file=sys.stderr, flush=True)


class Load:
    """Greedy streams in a background thread for `seconds`; failures collected."""

    def __init__(self, dep, seconds: float):
        spec = dataclasses.replace(LOAD, duration_s=seconds, deadline_s=seconds + 240)
        self.result = None
        self._thread = threading.Thread(target=lambda: setattr(self, "result", run_load(dep.url, dep.model, spec)),
                                        daemon=True)
        self._thread.start()

    def join(self):
        self._thread.join(timeout=600)
        assert self.result is not None, "the load did not finish"
        assert not self.result.failed, self.result.summary()
        return self.result


@pytest.fixture(scope="module")
def watched(r2cc_two_nodes):
    dep = r2cc_two_nodes
    target = dep.url.removeprefix("http://")
    with PrometheusServer([target], interval_s=1.0) as prom:
        deadline = time.monotonic() + 30
        while not prom.targets_up() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert prom.targets_up(), f"Prometheus cannot scrape {target}"
        yield dep, prom, time.time()


def _why(dep, prom) -> list[str]:
    """What a failed assertion here must show: the R2cc alerts firing (name, host, rail), every
    rail not up now, and every rail's changes of state with their errors."""
    from r2cc_testbed.serving import evidence

    status = evidence.read_status(dep.status_dir)
    return ([f"{a['alertname']} host={a.get('host')} rail={a.get('rail')}" for a in prom.firing()
             if a["alertname"].startswith("R2cc")] +
            [f"{k}: {v}" for k, v in evidence.rails_not_up(status).items()] +
            [f"{t.seen_at:.1f} rank {t.rank} rail {t.rail}: {t.old} -> {t.new} {t.reason[:160]}"
             for t in evidence.status_transitions(status)])


def _rail_down_alert(prom, host: str, rail: int) -> bool:
    return any(a["alertname"] == "R2ccRailDown" and a.get("host") == host and a.get("rail") == str(rail)
               for a in prom.firing())


def test_a_fault_free_minute_fires_nothing(watched):
    dep, prom, _ = watched
    start = time.time()
    load = Load(dep, 60)
    while time.time() - start < 60:
        assert not [a for a in prom.firing() if a["alertname"].startswith("R2cc")], _why(dep, prom)
        time.sleep(1)
    load.join()
    fired = prom.query(f'count_over_time(ALERTS{{alertname=~"R2cc.*", alertstate="firing"}}[{int(time.time() - start) + 5}s])')
    assert fired == [], fired
    # Every rail up, within a few scrapes: on a busy host r2cc sets a rail aside for a moment when
    # the peer's data stops on it (a starved thread looks like a stuck path from here) and takes it
    # back ~0.1 s later, which pages nobody; a rail held out for 10 s fails the loop above.
    deadline = time.time() + UP_AGAIN_WITHIN_S
    while True:
        up = prom.query("r2cc_host_rails_up")
        every = sorted(s["metric"]["host"] for s in up) == ["node0", "node1"] and all(s["value"][1] == "4" for s in up)
        if every or time.time() > deadline:
            break
        time.sleep(0.5)
    assert every, (up, _why(dep, prom))


def test_rail_down_pages_and_resolves(watched):
    dep, prom, _ = watched
    load = Load(dep, 45)
    time.sleep(5)
    t_fault = time.time()
    dep.lab.fault(0, 0, "down")
    try:
        while not _rail_down_alert(prom, "node0", 0) and time.time() - t_fault < FIRE_WITHIN_S:
            time.sleep(0.25)
        fired_s = time.time() - t_fault
        assert _rail_down_alert(prom, "node0", 0), (fired_s, prom.firing())
        _note(f"R2ccRailDown for node0 rail0 firing {fired_s:.1f} s after the link went down (rule for: 10 s)")
    finally:
        dep.lab.fault(0, 0, "up")
    t_up = time.time()
    while _rail_down_alert(prom, "node0", 0) and time.time() - t_up < RESOLVE_WITHIN_S:
        time.sleep(0.25)
    assert not _rail_down_alert(prom, "node0", 0), prom.firing()
    _note(f"resolved {time.time() - t_up:.1f} s after the link came back")
    load.join()
    others = {a["alertname"] for a in prom.firing()}
    assert not others & {"R2ccHostOnFallback", "R2ccGroupDown", "R2ccRailFlapping"}, others


def test_every_dashboard_query_returns_series_and_draws(watched, tmp_path):
    dep, prom, since = watched
    end = time.time()
    problems = {title: p for title, p in dashboard.check(prom, since, end).items() if p}
    assert problems == {}, problems
    png = dashboard.render(prom, since, end, str(tmp_path / "dashboard.png"))
    import os

    assert os.path.getsize(png) > 20_000
