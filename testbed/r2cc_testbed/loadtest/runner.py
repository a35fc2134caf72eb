"""Run one scenario: lab, model, one deployment per backend, interleaved rounds, saved results.

Per backend: start the deployment (float32: greedy outputs comparable across rounds), start
the fault daemon, measure saturation when the rate is a share of it, then fault-free and
faulted rounds in turn (ABAB...: slow drifts of a shared machine hit both kinds alike), then
the batch-of-one output check. A faulted round that leaves the deployment dead or unhealthy
ends that backend's rounds (the report says when and how). Everything is stopped and removed
on the way out, whatever happens; results are saved after every round.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import time

import httpx

from r2cc_serve.admin.snapshot import HEALTHY
from r2cc_serve.errors import UserError
from r2cc_testbed.faults.model import FaultSchedule, FaultSpec
from r2cc_testbed.faults.schedule import undo_faults
from r2cc_testbed.loadtest import analysis
from r2cc_testbed.loadtest.controller import FaultController
from r2cc_testbed.loadtest.rounds import Round, RoundPlan, Target, run_round
from r2cc_testbed.loadtest.scenario import Scenario
from r2cc_testbed.serving.deploy import DeployError, single_instance, two_nodes
from r2cc_testbed.lab.session import lab_session
from r2cc_testbed.serving.model_dir import temp_model

RESULT_FILE = "result.json"
SETTLE_TIMEOUT_S = 30.0
LAB_WAIT_S = 600.0  # another lab may hold the subnet for a while


def run_scenario(sc: Scenario, out_root: str, *, port: int, lab_prefix: str, say) -> dict:
    out = os.path.join(out_root, sc.name)
    raw = os.path.join(out, "raw")
    os.makedirs(raw, exist_ok=True)
    result = {"scenario": sc.to_dict(), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(),
              "backends": {}}
    say(f"{sc.name}: lab {sc.hosts} hosts x {sc.rails} rails at {sc.rate}; backends {', '.join(sc.backends)}")
    with lab_session(sc.hosts, sc.rails, sc.rate, prefix=lab_prefix, wait_s=LAB_WAIT_S) as lab, \
            temp_model("float32") as model:
        for backend in sc.backends:
            entry = result["backends"][backend] = {"rounds": [], "notes": []}
            try:
                _run_backend(sc, backend, lab, model, raw, port, entry, lambda: save(out, result), say)
            except UserError as exc:  # a deployment or a load that cannot run: the next backend may
                entry["notes"].append(f"stopped: {str(exc).splitlines()[0]}")
                say(f"{sc.name}/{backend}: stopped: {exc}")
            save(out, result)
    result["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    save(out, result)
    return result


def save(out: str, result: dict) -> None:
    tmp = os.path.join(out, RESULT_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(result, f, default=str)
    os.replace(tmp, os.path.join(out, RESULT_FILE))


def _run_backend(sc: Scenario, backend: str, lab, model: str, raw: str, port: int, entry: dict, checkpoint, say):
    token = secrets.token_hex(16)
    deploy = two_nodes if sc.shape == "two-nodes" else single_instance
    extra_env = {"R2CC_ADMIN_TOKEN": token} if backend == "r2cc" else None
    tag = f"{sc.name}/{backend}"
    say(f"{tag}: starting vLLM ({sc.shape}, TP=2); 1-3 min on a busy 2-core box")
    with deploy(lab, model, backend=backend, port=port, extra_env=extra_env, log_dir=os.path.join(raw, backend),
                extra_args=("--dtype", "float32", *sc.vllm_args)) as dep:
        entry["deploy"] = {"startup_s": round(dep.startup_s, 1), "warmup_s": round(dep.warmup_s, 1), "url": dep.url}
        labels = _host_labels(dep, lab) if backend == "r2cc" else {}
        with FaultController(lab, admin_url=dep.url, token=token, host_labels=labels,
                             log_path=os.path.join(raw, f"{backend}-fault-daemon.log")) as ctl:
            entry["fault_daemon"] = ctl.priority
            target = Target(dep=dep, lab=lab, model_dir=model, backend=backend, load=sc.load,
                            client_nice=sc.method.client_nice, stall_abort_s=sc.method.stall_abort_s,
                            out_dir=raw, controller=ctl)
            rate, concurrency = _resolve_load(sc, target, entry, say)
            num = sc.load.requests_at(rate)
            entry["load"] = {"request_rate": rate, "concurrency": concurrency, "requests": num}
            deadline = _round_deadline(sc, num, rate, concurrency)
            plans = [RoundPlan(kind, pair, num, rate, concurrency, deadline,
                               sc.schedule if kind == "fault" else sc.reference)
                     for pair in range(1, sc.method.pairs + 1) for kind in ("free", "fault")]
            for n, plan in enumerate(plans, 1):
                if not _ready_for_round(dep, backend, sc, entry, say, tag):
                    entry["notes"].append(f"rounds {n}..{len(plans)} not run: the deployment is not serving")
                    break
                say(f"{tag}: round {n}/{len(plans)} ({'faulted' if plan.kind == 'fault' else 'fault-free'}, "
                    f"pair {plan.pair}): {num} requests" + (f" at {rate:.3g} req/s" if rate else f", {concurrency} in flight"))
                rnd = run_round(target, plan, say)
                entry["rounds"].append(rnd.to_dict())
                checkpoint()
                say(f"{tag}: " + analysis.round_line(rnd))
                if plan.kind == "free" and sc.reference.entries:
                    _restore(lab, sc.reference, rnd, ctl, entry)
                if plan.kind == "fault":
                    _restore(lab, sc.schedule, rnd, ctl, entry)
                    if rnd.ended != "completed" or any(f["kind"] == "node" for f in rnd.failures):
                        entry["notes"].append(f"the deployment did not survive {plan.name} ({rnd.ended}); "
                                              "its remaining rounds were not run")
                        say(f"{tag}: {entry['notes'][-1]}")
                        return
            _serial_check(sc, target, entry, say, tag, checkpoint)


def _resolve_load(sc: Scenario, target: Target, entry: dict, say) -> tuple[float | None, int | None]:
    """(request rate, concurrency) of the rounds; a "NN%" rate needs a saturation round first."""
    load = sc.load
    if load.saturation_fraction is None:
        return load.request_rate, load.concurrency
    m = sc.method
    say(f"{sc.name}/{target.backend}: measuring saturation ({m.saturation_requests} requests, "
        f"{m.saturation_concurrency} in flight)")
    plan = RoundPlan("saturation", 0, m.saturation_requests, None, m.saturation_concurrency,
                     _round_deadline(sc, m.saturation_requests, None, m.saturation_concurrency))
    rnd = run_round(target, plan, say)
    entry["saturation"] = rnd.to_dict()
    throughput = rnd.summary.get("request_throughput")
    if rnd.ended != "completed" or not throughput:
        raise UserError(f"{sc.name}/{target.backend}: the saturation round did not complete ({rnd.ended}); "
                        "give load.request_rate in req/s instead of a percentage")
    rate = throughput * load.saturation_fraction
    say(f"{sc.name}/{target.backend}: saturation {throughput:.3g} req/s; rounds at "
        f"{load.saturation_fraction:.0%} = {rate:.3g} req/s")
    return rate, None


def _round_deadline(sc: Scenario, num: int, rate: float | None, concurrency: int | None) -> float:
    """Seconds from t0 a round may take: generous, but finite."""
    if sc.method.round_timeout_s:
        return sc.method.round_timeout_s
    per_request = sc.load.output_len * 0.5  # a stream slower than 2 tokens/s is broken here
    expected = num / rate + per_request if rate else num / concurrency * per_request
    return max(2 * expected, sc.schedule_end_s + 30) + 60


def _ready_for_round(dep, backend: str, sc: Scenario, entry: dict, say, tag: str) -> bool:
    """The deployment serves, and (r2cc) every data rail is up again; then a short settle."""
    try:
        dep.check_alive()
        if httpx.get(f"{dep.url}/health", timeout=10, trust_env=False).status_code != 200:
            raise httpx.HTTPError("/health did not answer 200")
    except (DeployError, httpx.HTTPError) as exc:
        say(f"{tag}: the deployment is not serving: {str(exc).splitlines()[0]}")
        return False
    if backend == "r2cc":
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while (down := _rails_not_up(dep)) and time.monotonic() < deadline:
            time.sleep(0.5)
        if down:
            entry["notes"].append(f"a round started with rails not up: {', '.join(down)}")
    time.sleep(sc.method.settle_s)
    return True


def _rails_not_up(dep) -> list[str]:
    try:
        rails = httpx.get(f"{dep.url}/r2cc/v1/rails", timeout=10, trust_env=False).json()["rails"]
    except (httpx.HTTPError, ValueError, KeyError):
        return ["(rails unknown: the admin API did not answer)"]
    # "slow" is in service: after a blackhole the rail's bandwidth figure stays low until a
    # bandwidth-bound transfer measures it again, which waiting here would not bring
    return [f"{r['host']} rail{r['rail']} {r['state']}" for r in rails
            if not r["fallback"] and r["state"] not in HEALTHY]


def _host_labels(dep, lab) -> dict[int, str]:
    """Lab host index -> host name in the admin API (<prefix>-hN in one instance, nodeN on two nodes)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        try:
            known = {r["host"] for r in httpx.get(f"{dep.url}/r2cc/v1/rails", timeout=10,
                                                   trust_env=False).json()["rails"]}
        except (httpx.HTTPError, ValueError, KeyError):
            known = set()
        labels = {i: name for i in range(lab.hosts) for name in (lab.host_ns(i), f"node{i}") if name in known}
        if len(labels) == 2 or time.monotonic() > deadline:
            return labels
        time.sleep(1.0)


def _restore(lab, schedule: FaultSchedule, rnd: Round, ctl, entry: dict) -> None:
    """Leave no fault behind a faulted round: clear every rail the schedule touched (the lab's own,
    slower path, which also fixes its state file), and undo admin actions a cut-short schedule left."""
    finished = rnd.schedule_outcome == "finished"

    def undo(spec: FaultSpec, _background: bool) -> None:
        if not spec.is_admin:
            lab.inject(spec)
        elif not finished:
            ctl.play(time.monotonic(), FaultSchedule((dataclasses.replace(spec, after_s=0.0),)))
            ctl.wait(15.0)

    def failed(spec: FaultSpec, exc: Exception) -> None:  # the next round's readiness check catches the rest
        entry["notes"].append(f"restoring {spec.text} after {rnd.plan['kind']}-{rnd.plan['pair']}: {exc}")

    undo_faults(schedule.entries, undo, lab.rails, on_error=failed)


def _serial_check(sc: Scenario, target: Target, entry: dict, say, tag: str, checkpoint) -> None:
    """Outputs with one request at a time (a batch of one, as under --max-num-seqs 1): batching
    cannot change them, so a difference here would be the communicator's, not the batch's.
    Fault-free always (compared across backends); with the faults too on r2cc when its faulted
    rounds' outputs differed from the fault-free ones."""
    n = sc.method.serial_requests
    if n == 0 or not entry["rounds"]:
        return
    kinds = ["serial-free"]
    if target.backend == "r2cc" and sc.schedule.entries and analysis.self_mismatches(entry):
        kinds.append("serial-fault")
    for kind in kinds:
        if not _ready_for_round(target.dep, target.backend, sc, entry, say, tag):
            return
        plan = RoundPlan(kind, 0, n, None, 1, _round_deadline(sc, n, None, 1),
                         sc.schedule if kind == "serial-fault" else FaultSchedule())
        say(f"{tag}: {kind} check: {n} requests one at a time")
        rnd = run_round(target, plan, say)
        entry.setdefault("serial", []).append(rnd.to_dict())
        checkpoint()
        if kind == "serial-fault":
            _restore(target.lab, sc.schedule, rnd, target.controller, entry)
