"""Percentiles and bootstrap intervals of overheads, on data whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from r2cc_testbed.loadtest.intervals import Overhead, Units, overheads, percentile, verdict


def _rounds(rng, scale: float, n: int = 200) -> Units:
    return Units([[v] for v in rng.lognormal(0.0, 0.2, n) * scale])


def test_percentile_ignores_missing_values():
    assert percentile([1, None, 3], 50) == 2.0
    assert percentile([None], 99) is None


def test_resample_keeps_requests_whole():
    u = Units([[1.0, 1.0], [5.0], [], [7.0, 7.0, 7.0]])
    assert len(u) == 3 and u.flat.tolist() == [1.0, 1.0, 5.0, 7.0, 7.0, 7.0]
    draw = u.resample(np.random.default_rng(0))
    values, counts = np.unique(draw, return_counts=True)
    assert set(values) <= {1.0, 5.0, 7.0}
    assert all(c % {1.0: 2, 5.0: 1, 7.0: 3}[v] == 0 for v, c in zip(values, counts))


def test_no_change_gives_an_interval_around_zero():
    rng = np.random.default_rng(1)
    pairs = [(_rounds(rng, 1.0), _rounds(rng, 1.0)) for _ in range(3)]
    for o in overheads(pairs, n_boot=300):
        assert o.low < 0 < o.high and o.pairs == 3
        assert verdict(o) in ("no significant change", "too wide to decide")


def test_a_ten_percent_slowdown_is_found():
    rng = np.random.default_rng(2)
    pairs = [(_rounds(rng, 1.0, 2000), _rounds(rng, 1.1, 2000)) for _ in range(3)]
    p50 = overheads(pairs, percentiles=(50,), n_boot=300)[0]
    assert 0.07 < p50.overhead < 0.13 and p50.low > 0
    assert verdict(p50) == "slower"
    assert verdict(p50, target=0.03) == "exceeds the 3% target"
    assert verdict(p50, target=0.5) == "meets the 50% target"


def test_one_pair_decides_nothing_however_narrow_its_interval():
    rng = np.random.default_rng(3)
    pairs = [(_rounds(rng, 1.0, 2000), _rounds(rng, 1.5, 2000))]
    p50 = overheads(pairs, percentiles=(50,), n_boot=300)[0]
    assert p50.low > 0.3 and p50.pairs == 1  # narrow: requests are all it resamples
    assert verdict(p50).startswith("not decided: 1 pair(s)")
    assert verdict(p50, target=0.03).startswith("not decided")


def test_verdicts_in_words():
    assert verdict(Overhead(99, 1, 1.01, 0.01, -0.2, 0.3, 3), 0.03).startswith("undecided: the interval is too wide")
    assert verdict(Overhead(99, 1, 1.01, 0.01, -0.2, 0.3, 3)) == "too wide to decide"
    assert verdict(Overhead(99, None, None, None, None, None, 0)) == "no data"


def test_empty_rounds_give_no_numbers():
    assert overheads([(Units([]), Units([[1.0]]))])[0].overhead is None


@pytest.mark.parametrize("n_boot", [0, 1])
def test_tiny_bootstraps_do_not_crash(n_boot):
    rng = np.random.default_rng(3)
    o = overheads([(_rounds(rng, 1.0), _rounds(rng, 1.0))], n_boot=n_boot)[0]
    assert o.overhead is not None


def test_a_slow_rail_is_in_service_before_a_round(monkeypatch):
    """Rounds wait for rails out of service, not for a rail whose bandwidth figure is low."""
    from r2cc_testbed.loadtest import runner

    class Answer:
        def json(self):
            return {"rails": [{"host": "node0", "rail": 0, "state": "slow", "fallback": False},
                              {"host": "node1", "rail": 2, "state": "down", "fallback": False},
                              {"host": "node1", "rail": 4, "state": "down", "fallback": True}]}

    monkeypatch.setattr(runner.httpx, "get", lambda *a, **k: Answer())

    class Dep:
        url = "http://x"

    assert runner._rails_not_up(Dep()) == ["node1 rail2 down"]
