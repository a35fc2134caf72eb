"""A load-test scenario (one YAML file): deployment, lab, load, method, targets, fault schedule.

    name: rail-down-restore
    description: one rail of host 0 down for 10 s under steady load, then back
    deployment: {shape: two-nodes, backends: [r2cc, default, default-mptcp], vllm_args: []}
    lab: {hosts: 2, rails: 4, rate: 1gbit}
    load: {dataset: random, input_len: 64, output_len: 32, request_rate: 70%, duration_s: 40, seed: 0}
    method: {pairs: 3}
    targets: {tpot_p99: 3%, e2el_p99: 5%}
    faults:
      - {at: 12, do: h0:1:down}
      - {at: 22, do: h0:1:up}
    reference_faults: []                    # optional: what the reference ("fault-free") rounds hold,
                                            # e.g. the same rail drained, to set a lossy rail against
    quick: {load: {...}, faults: [...]}      # overrides for --quick (mappings merge, lists replace)

Pure: parsing fails with a UserError naming the file and the key before anything starts.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
from dataclasses import dataclass, field

import yaml

from r2cc_serve.errors import UserError
from r2cc_testbed.faults.model import FaultSchedule, labelled
from r2cc_serve.util.rates import check_rate
from r2cc_testbed.serving import vllm_env

SHAPES = ("two-nodes", "single")
BACKENDS = vllm_env.BACKENDS  # r2cc, and vLLM's default backend in its three wirings
DEFAULT_BACKENDS = ("r2cc", "default", "default-mptcp")
METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (50, 90, 99)
_TARGET_KEY = re.compile(r"^(ttft|tpot|itl|e2el)_p(50|90|99)$")
_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
_TOP_KEYS = {"name", "description", "deployment", "lab", "load", "method", "targets", "faults", "reference_faults",
             "quick"}


@dataclass(frozen=True)
class Load:
    """What `vllm bench serve` sends. Exactly one of request_rate / saturation_fraction / concurrency."""
    dataset: str = "random"                  # "random", or a JSONL file of {"prompt": ...} lines
    input_len: int = 64
    output_len: int = 32
    request_rate: float | None = None        # requests per second (Poisson arrivals)
    saturation_fraction: float | None = None  # "70%": that share of the measured saturation rate
    concurrency: int | None = None           # closed loop: this many requests in flight
    requests: int | None = None
    duration_s: float | None = None          # with a rate: requests = rate x duration
    seed: int = 0

    @property
    def open_loop(self) -> bool:
        return self.concurrency is None

    def requests_at(self, rate: float | None) -> int:
        """Number of requests of one round at `rate` req/s (the resolved rate for open loops)."""
        if self.requests is not None:
            return self.requests
        return max(1, round(rate * self.duration_s))


@dataclass(frozen=True)
class Method:
    pairs: int = 3                    # fault-free + faulted rounds, interleaved ABAB...
    round_timeout_s: float | None = None  # None: derived from the expected length of a round
    stall_abort_s: float = 60.0       # a round with requests pending and no token for this long ends
    settle_s: float = 2.0             # pause between rounds (rails back up, queues drained)
    serial_requests: int = 8          # the batch-of-one check of outputs (0: skip it)
    bootstrap: int = 2000             # resamples for the confidence intervals
    saturation_concurrency: int = 16  # how saturation is measured for a "NN%" request rate
    # 8 waves of 16: 3 waves (48 requests) read 10.8 and 19.6 req/s for r2cc in two scenarios of
    # one run on this shared box; the rounds' rate (a share of it) must not rest on one swing
    saturation_requests: int = 128
    client_nice: int = -5             # `vllm bench serve` runs at this nice (its own CPU waits are noise)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    path: str
    shape: str
    backends: tuple[str, ...]
    vllm_args: tuple[str, ...]
    hosts: int
    rails: int
    rate: str | None
    load: Load
    method: Method
    schedule: FaultSchedule
    targets: dict[str, float] = field(default_factory=dict)  # "tpot_p99" -> 0.03 (largest overhead accepted)
    reference: FaultSchedule = field(default_factory=FaultSchedule)  # held by the reference rounds
    quick: bool = False

    @property
    def schedule_end_s(self) -> float:
        return max((s.after_s + s.duration_s for s in self.schedule.entries + self.reference.entries), default=0.0)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["schedule"] = self.schedule.to_list()
        d["reference"] = self.reference.to_list()
        return d


def load_scenario(path: str, quick: bool = False, overrides: dict | None = None) -> Scenario:
    """Parse and check one scenario file; UserError on anything wrong, naming the file.
    `overrides` (e.g. from the command line) merge in last, after the quick variant."""
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except OSError as exc:
        raise UserError(f"cannot read scenario {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path} is not valid YAML: {exc}") from None
    with labelled(os.path.basename(path)):
        return parse_scenario(doc, path, quick, overrides)


def parse_scenario(doc, path: str = "scenario.yaml", quick: bool = False, overrides: dict | None = None) -> Scenario:
    doc = _mapping(doc, "the scenario")
    _no_unknown(doc, _TOP_KEYS, "the scenario")
    if quick:
        if "quick" not in doc:
            raise UserError("--quick needs a `quick:` section of overrides in the scenario")
        doc = merge(doc, _mapping(doc["quick"], "quick"))
    if overrides:
        doc = merge(doc, overrides)
    name = doc.get("name") or os.path.splitext(os.path.basename(path))[0]
    if not isinstance(name, str) or not re.match(r"^[a-z0-9][a-z0-9-]*$", name):
        raise UserError(f"name {name!r}: use lowercase letters, digits and dashes (it names the output folder)")
    dep = _section(doc, "deployment", {"shape", "backends", "vllm_args"})
    lab = _section(doc, "lab", {"hosts", "rails", "rate"})
    shape = dep.get("shape", "two-nodes")
    if shape not in SHAPES:
        raise UserError(f"deployment.shape {shape!r}: use one of {', '.join(SHAPES)}")
    backends = tuple(_str_list(dep.get("backends", list(DEFAULT_BACKENDS)), "deployment.backends"))
    bad = [b for b in backends if b not in BACKENDS]
    if not backends or bad or len(set(backends)) != len(backends):
        raise UserError(f"deployment.backends {list(backends)}: list each of {', '.join(BACKENDS)} at most once")
    for b in backends:
        with labelled("deployment.backends"):
            vllm_env.check_backend(b, "single" if shape == "single" else None)
    hosts, rails = _int(lab.get("hosts", 2), "lab.hosts", 2), _int(lab.get("rails", 4), "lab.rails", 1)
    if hosts != 2:
        raise UserError(f"lab.hosts {hosts}: the deployments run TP=2 on lab hosts 0 and 1, so use 2")
    rate = lab.get("rate", "1gbit")
    with labelled("lab.rate"):
        rate = None if rate is None else check_rate(rate)
    with labelled("faults"):
        schedule = FaultSchedule.parse(doc.get("faults", []), "faults").check(hosts, rails, "faults")
    with labelled("reference_faults"):
        reference = FaultSchedule.parse(doc.get("reference_faults") or [], "reference_faults").check(
            hosts, rails, "reference_faults")
    admin = [s.notation for s in schedule.entries + reference.entries if s.is_admin]
    if admin and backends != ("r2cc",):
        raise UserError(f"faults {', '.join(admin)} go through r2cc's admin API, which vLLM's default backend "
                        "does not have: use `backends: [r2cc]`")
    load = _parse_load(_section(doc, "load", {f.name for f in dataclasses.fields(Load)} | {"request_rate"}),
                       os.path.dirname(os.path.abspath(path)))
    method = _parse_method(_section(doc, "method", {f.name for f in dataclasses.fields(Method)}))
    targets = _parse_targets(doc.get("targets") or {})
    return Scenario(name=name, description=str(doc.get("description", "")).strip(), path=os.path.abspath(path),
                    shape=shape, backends=backends, vllm_args=tuple(_str_list(dep.get("vllm_args", []),
                                                                              "deployment.vllm_args")),
                    hosts=hosts, rails=rails, rate=rate, load=load, method=method, schedule=schedule, reference=reference,
                    targets=targets, quick=quick)


def merge(base: dict, over: dict) -> dict:
    """base with over's keys put in: mappings merge key by key, anything else is replaced."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _parse_load(d: dict, here: str) -> Load:
    dataset = d.get("dataset", "random")
    if not isinstance(dataset, str) or not dataset:
        raise UserError("load.dataset: use `random` or the path of a JSONL file of {\"prompt\": ...} lines")
    if dataset != "random":
        dataset = dataset if os.path.isabs(dataset) else os.path.join(here, dataset)
        if not os.path.isfile(dataset):
            raise UserError(f"load.dataset {dataset}: no such file")
    rate, fraction = d.get("request_rate"), None
    if isinstance(rate, str):
        m = _PERCENT.match(rate)
        if not m or not 0 < float(m.group(1)) <= 100:
            raise UserError(f"load.request_rate {rate!r}: use requests per second or a share of saturation, e.g. 70%")
        rate, fraction = None, float(m.group(1)) / 100
    elif rate is not None:
        rate = _positive(rate, "load.request_rate")
    concurrency = None if d.get("concurrency") is None else _int(d["concurrency"], "load.concurrency", 1)
    if sum(x is not None for x in (rate, fraction, concurrency)) != 1:
        raise UserError("load: give exactly one of request_rate (req/s or NN%) and concurrency")
    requests = None if d.get("requests") is None else _int(d["requests"], "load.requests", 1)
    duration = None if d.get("duration_s") is None else _positive(d["duration_s"], "load.duration_s")
    if (requests is None) == (duration is None):
        raise UserError("load: give exactly one of requests and duration_s")
    if duration is not None and concurrency is not None:
        raise UserError("load.duration_s needs a request_rate; with concurrency give the number of requests")
    return Load(dataset=dataset, input_len=_int(d.get("input_len", 64), "load.input_len", 1),
                output_len=_int(d.get("output_len", 32), "load.output_len", 2), request_rate=rate,
                saturation_fraction=fraction, concurrency=concurrency, requests=requests, duration_s=duration,
                seed=_int(d.get("seed", 0), "load.seed", 0))


def _parse_method(d: dict) -> Method:
    m = Method()
    changes = {}
    for key, value in d.items():
        default = getattr(m, key)
        name = f"method.{key}"
        if key == "round_timeout_s":
            changes[key] = None if value is None else _positive(value, name)
        elif key == "client_nice":
            changes[key] = _int(value, name, -20)
        elif isinstance(default, int):
            changes[key] = _int(value, name, 1 if key == "pairs" else 0)
        else:
            changes[key] = _positive(value, name)
    return dataclasses.replace(m, **changes)


def _parse_targets(d) -> dict[str, float]:
    out = {}
    for key, value in _mapping(d, "targets").items():
        if not _TARGET_KEY.match(str(key)):
            raise UserError(f"targets.{key}: use <metric>_p<percentile> with metric one of {', '.join(METRICS)} "
                            f"and percentile one of {', '.join(map(str, PERCENTILES))}, e.g. tpot_p99: 3%")
        m = _PERCENT.match(value) if isinstance(value, str) else None
        if m:
            out[key] = float(m.group(1)) / 100
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            out[key] = float(value)
        else:
            raise UserError(f"targets.{key} {value!r}: give the largest overhead accepted, e.g. 3% or 0.03")
    return out


def _section(doc: dict, key: str, allowed: set[str]) -> dict:
    d = _mapping(doc.get(key) or {}, key)
    _no_unknown(d, allowed, key)
    return d


def _mapping(value, what: str) -> dict:
    if not isinstance(value, dict):
        raise UserError(f"{what}: expected a mapping of keys, got {type(value).__name__}")
    return value


def _no_unknown(d: dict, allowed: set[str], what: str) -> None:
    unknown = sorted(str(k) for k in d if k not in allowed)
    if unknown:
        raise UserError(f"{what}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}")


def _str_list(value, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(x, (str, int, float)) for x in value):
        raise UserError(f"{what}: expected a list, e.g. [a, b]")
    return [str(x) for x in value]


def _int(value, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(f"{what}: expected a whole number >= {minimum}, got {value!r}")
    return value


def _positive(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise UserError(f"{what}: expected a number > 0, got {value!r}")
    return float(value)


def scenario_dir() -> str:
    """loadtests/scenarios of the checkout this package lives in."""
    from r2cc_testbed import PROJECT_ROOT

    return os.path.join(PROJECT_ROOT, "loadtests", "scenarios")


def list_scenarios(folder: str | None = None) -> list[Scenario]:
    folder = folder or scenario_dir()
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith((".yaml", ".yml")))
    except OSError as exc:
        raise UserError(f"cannot list scenarios in {folder}: {exc.strerror}") from None
    return [load_scenario(os.path.join(folder, n)) for n in names]
