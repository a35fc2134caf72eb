"""A host loses every rail (no fallback) while requests decode: what the engine does, timed.

    out = run_outage(dep, host=1, hold_s=30)      # dep: a deployment from deploy.py
    out.summary()

The sequence: a fault-free load (the reference of this deployment), then long requests in flight,
every data rail of `host` down for hold_s, the rails back, then the same load again. Recorded:
when each in-flight request ended and how (finish_reason, stop_reason or error); what
GET /fault_tolerance/status said and when (with --enable-fault-tolerance); when the rails came
back and when a request was answered again; whether the vLLM processes are the ones that
started (no restart) and the model was loaded once; and the tokens before and after.

Every wait is bounded; the rails are brought back whatever happens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import threading
import time
from dataclasses import dataclass, field

import httpx

from r2cc_testbed.faults.model import FaultSpec
from r2cc_testbed.faults.schedule import HeldFaults
from r2cc_testbed.results import add_out_argument
from r2cc_testbed.serving.load import LoadResult, LoadSpec, compare, run_load

# Written once per worker when its weights are loaded (vLLM 0.32: "Loading weights took");
# more lines than workers after the fault would mean a reload.
_MODEL_LOADED = re.compile(r"Loading weights took")


@dataclass
class OutageResult:
    host: int
    hold_s: float
    injected_at: float | None = None
    restored_at: float | None = None   # every rail restored (the last `ip link set up` returned)
    # The restore began: the first rail may carry traffic from here on, and a busy box took long
    # enough over the rest that a request queued during the outage was served before restored_at.
    restoring_at: float | None = None
    inflight: list[dict] = field(default_factory=list)   # per in-flight request: end time, how
    status: list[tuple[float, str, str]] = field(default_factory=list)  # (time, status, fault_info)
    unhealthy_at: float | None = None
    healthy_at: float | None = None
    served_again_at: float | None = None  # a request answered after the rails' return
    procs_alive_after: bool = False
    model_loads: int = 0
    before: LoadResult | None = None
    after: LoadResult | None = None
    token_diffs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    retries: list[tuple[float, int]] = field(default_factory=list)  # operator's POSTs: (time, HTTP status)
    queued: dict | None = None  # a request sent halfway through the outage: when and how it ended
    admin_health_after: dict | None = None  # r2cc's GET /r2cc/v1/health after the outage (new groups' agents)

    def _rel(self, t: float | None, base: float | None) -> float | None:
        return None if t is None or base is None else round(t - base, 3)

    def inflight_end_s(self) -> list[float | None]:
        """Seconds from the fault to the end of each in-flight request."""
        return [self._rel(r["ended_at"], self.injected_at) for r in self.inflight]

    def summary(self) -> dict:
        return {
            "host": self.host, "hold_s": self.hold_s,
            "inflight_end_after_fault_s": self.inflight_end_s(),
            "inflight": [{k: r[k] for k in ("finish_reason", "stop_reason", "error", "tokens")} for r in self.inflight],
            "unhealthy_after_fault_s": self._rel(self.unhealthy_at, self.injected_at),
            "healthy_after_return_s": self._rel(self.healthy_at, self.restored_at),
            "served_after_return_s": self._rel(self.served_again_at, self.restored_at),
            "procs_alive_after": self.procs_alive_after, "model_loads": self.model_loads,
            "after_ok": None if self.after is None else len(self.after.ok),
            "after_failed": None if self.after is None else len(self.after.failed),
            "token_diffs": self.token_diffs[:3], "errors": self.errors,
            "operator_retries": [(self._rel(t, self.restored_at), code) for t, code in self.retries],
            "admin_health_after": self.admin_health_after,
            "queued_request": None if self.queued is None else {
                "sent_after_fault_s": self._rel(self.queued["sent_at"], self.injected_at),
                "ended_after_return_s": self._rel(self.queued["ended_at"], self.restored_at),
                "ok": self.queued["ok"], "finish_reason": self.queued["finish_reason"],
                "error": (self.queued["error"] or "")[:200]},
            "status_changes": [(self._rel(t, self.injected_at), s, (i or "")[:160]) for t, s, i in self.status],
        }


def ft_status(client: httpx.Client, url: str) -> tuple[str, str]:
    """(status, fault_info) of engine 0 from GET /fault_tolerance/status; ("absent", "") without the flag,
    ("down", why) when the server does not answer."""
    try:
        r = client.get(f"{url}/fault_tolerance/status", timeout=2.0)
    except httpx.HTTPError as exc:
        return "down", f"{type(exc).__name__}"
    if r.status_code == 404:
        return "absent", ""
    engines = (r.json() or {}).get("engines") or [{}]
    return str(engines[0].get("status", "?")), str(engines[0].get("fault_info") or "")


def _long_requests(dep, n: int, max_tokens: int, out: list, timeout_s: float) -> None:
    spec = LoadSpec(max_tokens=max_tokens, concurrency=n, request_timeout_s=timeout_s, deadline_s=timeout_s + 10)
    spec.prompts = spec.prompts[:n]
    res = run_load(dep.url, dep.model, spec)
    for r in res.results:
        out.append({"ended_at": r.finished_at or time.time(), "finish_reason": r.finish_reason,
                    "stop_reason": r.stop_reason, "error": r.error, "tokens": len(r.token_ids), "ok": r.ok})


def _answered(client: httpx.Client, dep, timeout_s: float) -> bool:
    body = {"model": dep.model, "prompt": "Hello", "max_tokens": 2, "temperature": 0}
    try:
        r = client.post(f"{dep.url}/v1/completions", json=body, timeout=timeout_s)
    except httpx.HTTPError:
        return False
    return r.status_code == 200 and r.json().get("choices", [{}])[0].get("finish_reason") in ("length", "stop")


def run_outage(dep, load: LoadSpec, *, host: int = 1, after_s: float = 2.0, hold_s: float = 30.0,
               inflight: int = 4, inflight_tokens: int = 1500, recover_timeout_s: float = 60.0,
               operator_retry: bool = False, say=print) -> OutageResult:
    """See the module docstring. `load` is run before and after (same prompts, greedy).
    operator_retry: after the rails' return, POST /fault_tolerance/apply {"instruction": "retry"}
    (every 0.5 s while the engine is unhealthy), as an operator would with R2CC_FT_AUTO_RETRY=0."""
    out = OutageResult(host=host, hold_s=hold_s)
    lab = dep.lab
    out.before = run_load(dep.url, dep.model, load)
    if out.before.failed:
        out.errors.append(f"fault-free load before the fault failed: {out.before.summary()['errors']}")
        return out
    ended: list[dict] = []
    t = threading.Thread(target=_long_requests, args=(dep, inflight, inflight_tokens, ended, hold_s + 120),
                         daemon=True, name="outage-inflight")
    # Sent halfway through the outage: with --enable-fault-tolerance it waits in the engine's queue.
    queued: list[dict] = []
    queued_sent = 0.0
    mid = threading.Thread(target=_long_requests, args=(dep, 1, 16, queued, hold_s + 120), daemon=True,
                           name="outage-queued")
    spec = FaultSpec("all-down", host=host)
    held = HeldFaults.on_lab(lab, on_error=lambda undo, exc: out.errors.append(f"restore rail {undo.rail}: {exc}"))
    with httpx.Client(trust_env=False) as client:
        t.start()
        time.sleep(after_s)
        try:
            held.hold(spec)
            out.injected_at = time.time()
            say(f"[outage] every data rail of host {host} down")
            last = None
            while time.time() < out.injected_at + hold_s:
                if not mid.is_alive() and not mid.ident and time.time() > out.injected_at + hold_s / 2:
                    queued_sent = time.time()
                    mid.start()
                st, info = ft_status(client, dep.url)
                if (st, info) != last:
                    out.status.append((time.time(), st, info))
                    last = (st, info)
                if st == "unhealthy" and out.unhealthy_at is None:
                    out.unhealthy_at = time.time()
                time.sleep(0.1)
        finally:
            out.restoring_at = time.time()
            held.undo()  # every rail, each on its own: a failure is reported, the others still restored
            out.restored_at = time.time()
            say(f"[outage] rails of host {host} back")
        t.join(timeout=hold_s + 150)
        out.inflight = sorted(ended, key=lambda r: r["ended_at"])
        deadline = out.restored_at + recover_timeout_s
        last_retry = 0.0
        while time.time() < deadline:
            st, info = ft_status(client, dep.url)
            if operator_retry and st == "unhealthy" and time.time() - last_retry > 0.5:
                last_retry = time.time()
                with contextlib.suppress(httpx.HTTPError):
                    r = client.post(f"{dep.url}/fault_tolerance/apply", json={"instruction": "retry"}, timeout=5.0)
                    out.retries.append((last_retry, r.status_code))
            if not out.status or out.status[-1][1:] != (st, info):
                out.status.append((time.time(), st, info))
            if st in ("healthy", "absent") and out.healthy_at is None:
                out.healthy_at = time.time()
            if st == "down" and not any(p.alive() for p in dep.procs):
                out.errors.append("every vLLM process exited")
                break
            if st in ("healthy", "absent") and _answered(client, dep, timeout_s=max(1.0, deadline - time.time())):
                out.served_again_at = time.time()
                break
            time.sleep(0.1)
    if mid.ident:
        mid.join(timeout=recover_timeout_s + 30)
        if queued:
            out.queued = dict(queued[0], sent_at=queued_sent)
    out.procs_alive_after = all(p.alive() for p in dep.procs)
    out.model_loads = sum(len(_MODEL_LOADED.findall(_read(p.log_path))) for p in dep.procs)
    if out.served_again_at is not None:
        out.after = run_load(dep.url, dep.model, dataclasses.replace(load))
        out.token_diffs = compare(out.before, out.after)
        out.admin_health_after = admin_health(dep.url)
    return out


def admin_health(url: str, timeout_s: float = 20.0) -> dict:
    """r2cc's own view after the outage: GET /r2cc/v1/health until it says ok (its agents are the
    re-formed groups' ones), at most timeout_s. {"code", "status", "reasons", "after_s"}."""
    t0 = time.time()
    last: dict = {}
    with httpx.Client(trust_env=False) as client:
        while True:
            try:
                r = client.get(f"{url}/r2cc/v1/health", timeout=5.0)
                body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
                last = {"code": r.status_code, "status": body.get("status"), "reasons": (body.get("reasons") or [])[:3]}
            except (httpx.HTTPError, ValueError) as exc:
                last = {"code": None, "status": None, "reasons": [f"{type(exc).__name__}"]}
            last["after_s"] = round(time.time() - t0, 2)
            if last.get("status") == "ok" or time.time() - t0 > timeout_s:
                return last
            time.sleep(0.5)


def _read(path: str) -> str:
    with contextlib.suppress(OSError), open(path, errors="replace") as f:
        return f.read()
    return ""


# --- `r2cc serve-outage`: the figure, with and without --enable-fault-tolerance -------------------

MODES = {
    "ft": "--enable-fault-tolerance, r2cc retries by itself (R2CC_FT_AUTO_RETRY=1, the default)",
    "ft-operator": "--enable-fault-tolerance, R2CC_FT_AUTO_RETRY=0: POST /fault_tolerance/apply after the return",
    "no-ft": "without the flag (vLLM's engine stops); then the time a fresh start takes to serve",
}


def add_arguments(p) -> None:
    p.add_argument("--modes", default="ft,no-ft",
                   help=f"comma list of {', '.join(MODES)}, run in this order (default ft,no-ft)")
    p.add_argument("--cycles", type=int, default=1, help="run the mode list this many times (default 1)")
    p.add_argument("--hold", type=float, default=30.0, help="seconds every data rail of the host stays down")
    p.add_argument("--host", type=int, default=1, help="lab host whose rails go down (default 1)")
    p.add_argument("--rate", default="1gbit", help="rail shaping of the lab: a tc rate, or unshaped for "
                                                     "rails as fast as this CPU (default 1gbit)")
    p.add_argument("--port", type=int, default=8410, help="vLLM's API port (default 8410)")
    add_out_argument(p, "serve-outage", "every run's summary as JSON")
    p.add_argument("--keep-lab", action="store_true", help="leave the lab up afterwards")


def _row(mode: str, s: dict, restart: dict | None) -> str:
    def f(x, unit="s"):
        return "-" if x is None else f"{x:.2f} {unit}"

    ends = [t for t in s["inflight_end_after_fault_s"] if t is not None]
    how = sorted({r["finish_reason"] or (r["error"] or "")[:40] for r in s["inflight"]})
    same = "-" if s["after_ok"] is None else ("yes" if not s["token_diffs"] and not s["after_failed"] else "NO")
    text = (f"{mode:12s} in flight ended {f(max(ends) if ends else None)} after the fault ({', '.join(how)}); "
            f"unhealthy {f(s['unhealthy_after_fault_s'])}; served {f(s['served_after_return_s'])} after the "
            f"rails' return; processes kept: {s['procs_alive_after']}; weights loaded {s['model_loads']}x; "
            f"same tokens: {same}")
    if restart:
        text += (f"; a fresh start: healthy {restart['startup_s']:.1f} s + first request "
                 f"{restart['first_request_s']:.1f} s = {restart['total_s']:.1f} s")
    return text


def run(args) -> int:
    import sys

    from r2cc_serve.errors import UserError
    from r2cc_serve.util.rates import check_lab_rate
    from r2cc_testbed.results import check_out, write_result
    from r2cc_testbed.lab.session import lab_session
    from r2cc_testbed.serving.deploy import two_nodes
    from r2cc_testbed.serving.model_dir import temp_model

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if not modes or bad:
        raise UserError(f"--modes {args.modes!r}: use a comma list of {', '.join(MODES)}")
    load = LoadSpec(max_tokens=16, concurrency=4, request_timeout_s=180, deadline_s=360)
    results, rows = [], []
    check_out(args.out, "serve-outage")
    with lab_session(2, 4, check_lab_rate(args.rate), keep=args.keep_lab) as lab, temp_model("float32") as model:
        for cycle in range(1, args.cycles + 1):
            for mode in modes:
                flag = ("--enable-fault-tolerance",) if mode != "no-ft" else ()
                env = {"R2CC_FALLBACK_RAILS": "", "R2CC_FT_AUTO_RETRY": "0" if mode == "ft-operator" else "1"}
                print(f"[serve-outage] cycle {cycle}, {mode}: {MODES[mode]}", file=sys.stderr, flush=True)
                with two_nodes(lab, model, backend="r2cc", port=args.port, extra_args=("--dtype", "float32") + flag,
                               extra_env=env) as dep:
                    out = run_outage(dep, load, host=args.host, hold_s=args.hold,
                                     operator_retry=(mode == "ft-operator"),
                                     say=lambda m: print(m, file=sys.stderr, flush=True))
                    s = out.summary()
                restart = None
                if mode == "no-ft":
                    t0 = time.monotonic()
                    with two_nodes(lab, model, backend="r2cc", port=args.port, extra_args=("--dtype", "float32"),
                                   extra_env=env) as dep2:
                        restart = {"startup_s": dep2.startup_s, "first_request_s": dep2.warmup_s,
                                   "total_s": time.monotonic() - t0}
                results.append({"cycle": cycle, "mode": mode, "summary": s, "restart": restart})
                rows.append(_row(mode, s, restart))
                print(rows[-1], flush=True)
    if args.out:
        print(f"wrote {write_result(args.out, 'serve-outage', results)}", file=sys.stderr)
    print("\n".join([f"every data rail of host {args.host} down {args.hold:g} s, no fallback rail:"] + rows))
    return 0
