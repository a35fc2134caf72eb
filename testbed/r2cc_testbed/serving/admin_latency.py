"""`r2cc admin probe-latency`: how fast the admin API answers, optionally under a streaming load.

    r2cc admin probe-latency --url http://127.0.0.1:8000 --n 500 --load-model tiny

Sends N sequential GETs (one kept-alive connection, so TCP set-up is not measured) to
the admin path and, for comparison, to a plain route of the same server (vLLM's /health),
and prints p50/p99/max of each with the load average. With --load-model, a streaming
greedy load (r2cc_testbed.serving.load) runs against the same server for the whole probe,
from a child process.

Two client-side effects dwarf the server's answer time on a loaded 2-core box, and both
were seen here: `httpx.get()` builds a new client and TLS context per call (~80 ms of CPU),
and a normal-priority client can wait whole seconds for a CPU while vLLM's threads spin
(seen in /proc/<pid>/task/<tid>/schedstat). --realtime probes from a SCHED_FIFO thread to
take the second out of the numbers; print both to tell them apart. Every probe also reads
its own thread's run-queue wait (run_delay in /proc/thread-self/schedstat) around each
request and reports the latency net of it: what the server and the network took, even
from a normal-priority client (a nice-0 thread here waited up to ~1 s for a CPU while vLLM
decoded on both cores).
"""

from __future__ import annotations

import json
import os
import time

from r2cc_serve.errors import UserError
from r2cc_serve.util.percentile import percentile

PROBE_TIMEOUT_S = 10.0


def percentiles(lat_s: list[float]) -> dict:
    """p50/p99/max in milliseconds."""
    if not lat_s:
        return {"n": 0}
    return {"n": len(lat_s), "p50_ms": round(percentile(lat_s, 50) * 1e3, 2),
            "p99_ms": round(percentile(lat_s, 99) * 1e3, 2), "max_ms": round(max(lat_s) * 1e3, 2)}


def run_queue_wait_s() -> float:
    """Seconds this thread has spent runnable but waiting for a CPU (0.0 where the kernel does not say)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def probe(client, url: str, n: int, interval_s: float) -> list[tuple[float, float]]:
    """(latency, this thread's run-queue wait during it) of n GETs of url, one at a time;
    UserError on a failed or non-200 answer."""
    import httpx

    out = []
    for i in range(n):
        w0 = run_queue_wait_s()
        t0 = time.perf_counter()
        try:
            r = client.get(url)
        except httpx.HTTPError as exc:
            raise UserError(f"GET {url} failed after {i} probes ({type(exc).__name__}: {exc}); "
                            "is the server still up?") from None
        out.append((time.perf_counter() - t0, run_queue_wait_s() - w0))
        if r.status_code != 200:
            raise UserError(f"GET {url} answered HTTP {r.status_code}: {r.text[:200]}")
        if interval_s:
            time.sleep(interval_s)
    return out


def _realtime_thread() -> tuple[int, os.sched_param]:
    """SCHED_FIFO for the calling thread only (Linux: pid 0 is this thread); returns the old policy."""
    old = (os.sched_getscheduler(0), os.sched_getparam(0))
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except PermissionError:
        raise UserError("--realtime needs root (or CAP_SYS_NICE) to use SCHED_FIFO") from None
    return old


def measure(base: str, n: int, path: str = "/r2cc/v1/rails", compare_path: str | None = "/health",
            interval_s: float = 0.01, realtime: bool = False) -> dict:
    """{path: percentiles, compare_path: percentiles, loadavg: [...]}; the two probes interleave
    in blocks of 50 so both see the same load.

    realtime: probe from a SCHED_FIFO thread, so the numbers are the server's answer time and
    not the time this client waited for a CPU on a loaded box (both are worth knowing).
    """
    import httpx

    lat: dict[str, list[tuple[float, float]]] = {path: []}
    if compare_path:
        lat[compare_path] = []
    old = _realtime_thread() if realtime else None
    try:
        with httpx.Client(base_url=base.rstrip("/"), timeout=PROBE_TIMEOUT_S, trust_env=False) as client:
            probe(client, path, 3, 0)  # connection and first-request costs out of the numbers
            done = 0
            while done < n:
                k = min(50, n - done)
                for p in lat:
                    lat[p] += probe(client, p, k, interval_s)
                done += k
    finally:
        if old is not None:
            os.sched_setscheduler(0, old[0], old[1])
    out = {}
    for p, samples in lat.items():
        out[p] = percentiles([t for t, _ in samples])
        # What the server and network took: the latency less the time this client waited for a CPU.
        out[p]["net"] = percentiles([max(0.0, t - w) for t, w in samples])
        out[p]["client_wait"] = percentiles([w for _, w in samples])
    out["loadavg"] = list(os.getloadavg())
    out["client"] = "SCHED_FIFO" if realtime else "normal"
    return out


def _load_rounds(base: str, model: str, concurrency: int, max_tokens: int, stop, out) -> None:
    """Child process: rounds of streaming load (run_load fixes its end when it starts) until stop."""
    from r2cc_testbed.serving.load import LoadSpec, run_load

    spec = LoadSpec(max_tokens=max_tokens, concurrency=concurrency, duration_s=BackgroundLoad.ROUND_S,
                    request_timeout_s=120, deadline_s=BackgroundLoad.ROUND_S + 150)
    results, error = [], ""
    try:
        while not stop.is_set():
            results += run_load(base, model, spec).results
    except Exception as exc:  # reported by the parent
        error = f"{type(exc).__name__}: {exc}"
    failed = [r for r in results if not r.ok]
    out.put({"requests": len(results), "failed": len(failed), "tokens": sum(len(r.token_ids) for r in results),
             "errors": sorted({r.error for r in failed if r.error})[:3] + ([error] if error else [])})


class BackgroundLoad:
    """A streaming load in a child process (so it does not share this one's GIL) while a `with`
    block runs, then until its current round of ROUND_S ends."""

    ROUND_S = 5.0

    def __init__(self, base: str, model: str, concurrency: int, max_tokens: int):
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self._stop, self._out = ctx.Event(), ctx.Queue()
        self._proc = ctx.Process(target=_load_rounds, args=(base, model, concurrency, max_tokens, self._stop,
                                                            self._out), name="r2cc-probe-load", daemon=True)
        self.summary: dict = {}

    def __enter__(self) -> "BackgroundLoad":
        self._proc.start()
        time.sleep(3.0)  # streams in flight before the first probe
        return self

    def __exit__(self, *exc) -> None:
        import queue

        self._stop.set()
        try:
            self.summary = self._out.get(timeout=self.ROUND_S + 160)
        except queue.Empty:
            self.summary = {"errors": ["the load process gave no summary in time"]}
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=5)


def check_served(base: str, model: str) -> None:
    """UserError unless the server at base serves `model` (a load of 404s measures nothing)."""
    import httpx

    try:
        r = httpx.get(base + "/v1/models", timeout=PROBE_TIMEOUT_S, trust_env=False)
        served = [m["id"] for m in r.json()["data"]] if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        served = None
    if served is None:
        raise UserError(f"--load-model: {base}/v1/models did not list the served models; is this vLLM's "
                        "OpenAI server?")
    if model not in served:
        raise UserError(f"--load-model {model}: {base} does not serve it; it serves {', '.join(served)}")


def _print(out: dict) -> None:
    for p, st in out.items():
        if isinstance(st, dict) and "p50_ms" in st:
            net, wait = st["net"], st["client_wait"]
            print(f"GET {p:<16} n={st['n']:<4} p50 {st['p50_ms']:7.2f} ms  p99 {st['p99_ms']:8.2f} ms  "
                  f"max {st['max_ms']:8.2f} ms | net of client CPU wait: p50 {net['p50_ms']:6.2f} ms  "
                  f"p99 {net['p99_ms']:7.2f} ms | client waited p99 {wait['p99_ms']:.2f} ms")
    print("load average: " + " ".join(f"{x:.2f}" for x in out["loadavg"]) + f"; client thread: {out['client']}")
    if "load" in out:
        print(f"streaming load: {out['load']}")


def run(args) -> int:
    base = args.url.rstrip("/")
    if args.load_model:
        check_served(base, args.load_model)
        with BackgroundLoad(base, args.load_model, args.load_concurrency, args.load_tokens) as load:
            out = measure(base, args.n, args.path, args.compare or None, args.interval, args.realtime)
        out["load"] = load.summary
    else:
        out = measure(base, args.n, args.path, args.compare or None, args.interval, args.realtime)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        _print(out)
    load = out.get("load")
    if load is not None and (not load.get("requests") or load.get("failed")):
        raise UserError(f"the streaming load did not run cleanly ({load}): the figures above were not "
                        "taken under the load asked for")
    return 0


def register(sub) -> None:
    p = sub.add_parser("probe-latency", help="GET latency of the admin API (p50/p99), optionally under load")
    p.add_argument("--url", required=True, help="server base URL, e.g. vLLM's http://127.0.0.1:8000")
    p.add_argument("--n", type=int, default=500, help="GETs per path (default 500)")
    p.add_argument("--path", default="/r2cc/v1/rails", help="path to measure (default /r2cc/v1/rails)")
    p.add_argument("--compare", default="/health", help="a plain route of the same server to measure "
                   "beside it ('' for none; default vLLM's /health)")
    p.add_argument("--interval", type=float, default=0.01, help="pause between GETs in seconds (default 0.01)")
    p.add_argument("--load-model", help="run a streaming greedy load against this served model meanwhile")
    p.add_argument("--load-concurrency", type=int, default=4)
    p.add_argument("--load-tokens", type=int, default=32, help="max_tokens per load request")
    p.add_argument("--realtime", action="store_true", help="probe from a SCHED_FIFO thread (root): measures "
                   "the server, not this client's wait for a CPU on a loaded box")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)
