"""A saved result.json made up in memory, shaped like a real run's, for the pure tests."""

from __future__ import annotations

import random

from r2cc_testbed.loadtest.bench_serve import Request
from r2cc_testbed.loadtest.rounds import Round
from r2cc_testbed.loadtest.scenario import parse_scenario

SCENARIO = {
    "name": "fake", "description": "made up",
    "deployment": {"backends": ["r2cc", "default"]},
    "load": {"concurrency": 4, "requests": 30, "output_len": 8},
    "method": {"pairs": 2, "bootstrap": 200},
    "targets": {"tpot_p99": "3%"},
    "faults": [{"at": 2, "do": "h0:1:down"}, {"at": 4, "do": "h0:1:up"}, {"at": 5, "do": "h0:2:flap:100:3"}],
}


def requests(n: int, slow: float, rng: random.Random, texts: list[str], failed: tuple[int, ...] = ()) -> list[Request]:
    out = []
    for i in range(n):
        itls = [0.05 * slow * rng.uniform(0.9, 1.1) for _ in range(7)]
        ttft = 0.2 * rng.uniform(0.9, 1.1)
        ok = i not in failed
        out.append(Request(index=i, sent_s=i * 0.3, ok=ok, ttft_s=ttft if ok else None,
                           e2el_s=ttft + sum(itls) if ok else None, itls_s=itls if ok else [],
                           output_tokens=8 if ok else 0, text=texts[i] if ok else "",
                           error="" if ok else "ServerDisconnectedError: Server disconnected"))
    return out


def steps() -> list[dict]:
    out = [{"entry": 0, "at_s": 2.0, "kind": "down", "host": 0, "rail": 1, "rate": None, "label": "down h0 rail1"},
           {"entry": 1, "at_s": 4.0, "kind": "up", "host": 0, "rail": 1, "rate": None, "label": "up h0 rail1"}]
    for i in range(3):
        out.append({"entry": 2, "at_s": 5 + i * 0.1, "kind": "down", "host": 0, "rail": 2, "rate": None,
                    "label": f"flap {i + 1}/3 down h0 rail2"})
        out.append({"entry": 2, "at_s": 5.05 + i * 0.1, "kind": "up", "host": 0, "rail": 2, "rate": None,
                    "label": f"flap {i + 1}/3 up h0 rail2"})
    for s in out:
        s.update(due=s["at_s"], started=s["at_s"] + 0.0003, done=s["at_s"] + 0.0006, observed=s["at_s"] + 0.001,
                 wall_done=1000 + s["at_s"], error=None, detail="", event="step")
    return out


def metrics(stall: tuple[float, float] | None = None) -> list[dict]:
    out, tokens, sent = [], 0.0, {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}
    for n in range(24):
        t = n * 0.5
        if not (stall and stall[0] <= t < stall[1]):
            tokens += 20
            for k in sent:
                sent[k] += 0 if (k == 1 and 2 <= t < 4.5) else 1e5
        out.append({"t": t, "rail_sent": dict(sent), "tokens": tokens, "running": 4.0, "waiting": 0.0})
    return out


def round_dict(backend: str, kind: str, pair: int, slow: float, seed: int, texts, failed=(), stall=None) -> dict:
    rng = random.Random(seed)
    sc = parse_scenario(SCENARIO)
    r = Round(backend=backend, plan={"kind": kind, "pair": pair, "num_prompts": 30, "request_rate": None,
                                     "concurrency": 4, "deadline_s": 100.0,
                                     "schedule": sc.schedule.to_list() if kind == "fault" else []},
              ended="completed", requests=requests(30, slow, rng, texts, failed), steps=steps() if kind == "fault" else [],
              schedule_outcome="finished" if kind == "fault" else "", metrics=metrics(stall), wall_t0=1000.0,
              loadavg=(2.0, 2.5),
              events=[{"t": 2.1, "rail": 1, "from": "up", "to": "down", "host": "node0"},
                      {"t": 4.6, "rail": 1, "from": "down", "to": "up", "host": "node0"}] if kind == "fault" else [])
    r.duration_s = 12.0
    return r.to_dict()


def result(fault_slowdown: float = 1.02, default_breaks: bool = True) -> dict:
    sc = parse_scenario(SCENARIO)
    texts = [f"output {i}" for i in range(30)]
    backends = {}
    for backend in ("r2cc", "default"):
        rounds = []
        for pair in (1, 2):
            rounds.append(round_dict(backend, "free", pair, 1.0, pair, texts))
            breaks = backend == "default" and default_breaks
            rounds.append(round_dict(backend, "fault", pair, fault_slowdown, 10 + pair,
                                     texts if not breaks else texts[:5] + ["x"] * 25,
                                     failed=tuple(range(20, 30)) if breaks else (),
                                     stall=(2.0, 8.0) if breaks else None))
        backends[backend] = {"rounds": rounds, "notes": [], "deploy": {"startup_s": 30.0}, "fault_daemon": "SCHED_FIFO 50",
                             "load": {"request_rate": None, "concurrency": 4, "requests": 30},
                             "serial": [round_dict(backend, "serial-free", 0, 1.0, 99, texts)]}
    return {"scenario": sc.to_dict(), "started": "now", "finished": "later", "backends": backends}
