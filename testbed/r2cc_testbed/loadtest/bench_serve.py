"""`vllm bench serve`: the command line of one round, and the per-request data of its result file.

Greedy (--temperature 0), fixed lengths (--ignore-eos), a fixed seed (same prompts and, for
an open loop, the same arrival times every round), --save-result --save-detailed (per
request: send time, TTFT, every ITL, latency, generated text, error). Its send times are
time.perf_counter(), which on Linux is CLOCK_MONOTONIC: the same clock as time.monotonic()
in our process, so requests and faults share one time axis.

Token ids: `vllm bench serve` keeps only the generated text, so outputs are compared as text
(the tiny model's byte-level tokenizer makes equal text mean equal tokens in practice).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from r2cc_serve.errors import UserError
from r2cc_testbed.loadtest.scenario import Load

MAIN_RUN_MARK = "Starting main benchmark run..."  # printed right before the first request
PERCENTILES_ARG = "50,90,99"


def bench_argv(*, url: str, model_dir: str, served_name: str, load: Load, num_prompts: int,
               request_rate: float | None, concurrency: int | None, result_dir: str,
               result_file: str) -> list[str]:
    """argv of one round. request_rate None means all at once (closed loop with concurrency)."""
    argv = ["vllm", "bench", "serve", "--backend", "openai", "--endpoint", "/v1/completions",
            "--base-url", url, "--model", model_dir, "--served-model-name", served_name,
            "--tokenizer", model_dir, "--num-prompts", str(num_prompts), "--seed", str(load.seed),
            "--temperature", "0", "--ignore-eos", "--disable-tqdm", "--num-warmups", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", PERCENTILES_ARG,
            "--save-result", "--save-detailed", "--result-dir", result_dir, "--result-filename", result_file,
            "--request-rate", "inf" if request_rate is None else f"{request_rate:.6g}"]
    if concurrency is not None:
        argv += ["--max-concurrency", str(concurrency)]
    if load.dataset == "random":
        argv += ["--dataset-name", "random", "--random-input-len", str(load.input_len),
                 "--random-output-len", str(load.output_len), "--random-range-ratio", "0"]
    else:
        argv += ["--dataset-name", "custom", "--dataset-path", load.dataset, "--custom-output-len",
                 str(load.output_len), "--skip-chat-template", "--disable-shuffle"]
    return argv


@dataclass
class Request:
    """One request of a round, times in seconds; sent_s is relative to the round's t0."""
    index: int
    sent_s: float
    ok: bool
    ttft_s: float | None
    e2el_s: float | None
    itls_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    text: str = ""
    error: str = ""

    @property
    def tpot_s(self) -> float | None:
        """vLLM's definition: (latency - TTFT) / (output tokens - 1)."""
        if not self.ok or self.output_tokens < 2 or self.e2el_s is None or self.ttft_s is None:
            return None
        return (self.e2el_s - self.ttft_s) / (self.output_tokens - 1)

    def token_times_s(self) -> list[float]:
        """When each token after the first arrived (round time), for ITL-over-time plots."""
        if self.ttft_s is None:
            return []
        t, out = self.sent_s + self.ttft_s, []
        for gap in self.itls_s:
            t += gap
            out.append(t)
        return out

    def to_dict(self) -> dict:
        return {"index": self.index, "sent_s": self.sent_s, "ok": self.ok, "ttft_s": self.ttft_s,
                "e2el_s": self.e2el_s, "itls_s": self.itls_s, "output_tokens": self.output_tokens,
                "text": self.text, "error": self.error}

    @classmethod
    def from_dict(cls, d: dict) -> "Request":
        return cls(**d)


def read_result(path: str, t0: float) -> tuple[list[Request], dict]:
    """(requests in issue order, the tool's own summary numbers) from a --save-detailed file."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read the `vllm bench serve` result {path}: {exc}") from None
    return parse_result(doc, t0)


def parse_result(doc: dict, t0: float) -> tuple[list[Request], dict]:
    n = len(doc.get("start_times") or [])
    cols = {k: list(doc.get(k) or []) + [None] * (n - len(doc.get(k) or []))
            for k in ("ttfts", "itls", "latencies", "generated_texts", "errors", "output_lens")}
    requests = []
    for i in range(n):
        error = cols["errors"][i] or ""
        ok = not error and cols["ttfts"][i] is not None and (cols["latencies"][i] or 0) > 0
        itls = [float(x) for x in (cols["itls"][i] or [])]
        requests.append(Request(
            index=i, sent_s=float(doc["start_times"][i]) - t0, ok=ok,
            ttft_s=_num(cols["ttfts"][i]) if ok else None, e2el_s=_num(cols["latencies"][i]) if ok else None,
            itls_s=itls if ok else [], output_tokens=int(cols["output_lens"][i] or 0) if ok else 0,
            text=cols["generated_texts"][i] or "", error=_short(error)))
    summary = {k: v for k, v in doc.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return requests, summary


def _num(x) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _short(error: str) -> str:
    """The last line of a traceback says what happened; the rest is noise in a report."""
    lines = [ln.strip() for ln in error.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "")[:300]
