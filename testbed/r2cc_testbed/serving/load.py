"""Streaming load client for vLLM's /v1/completions: greedy, fixed length, token ids recorded.

Every request is `stream: true, temperature: 0, ignore_eos: true, max_tokens: N,
return_token_ids: true` (vLLM 0.32 then puts the new token ids of each chunk in
choices[0].token_ids), so two runs can be compared token for token. Per request we record
ok/failed, token ids, text, TTFT and every inter-token gap; a chunk carrying k tokens
counts as k gaps of 1/k of its delay each.

Bounded: at most `concurrency` requests in flight, each with a timeout, and the whole run
with a deadline; requests still running at the deadline count as failed.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx

from r2cc_serve.util.percentile import percentile

# Prompts of different lengths and contents, fixed so runs are comparable.
DEFAULT_PROMPTS = [
    "The quick brown fox",
    "Every rail between two servers carries part of each transfer",
    "When a link fails in the middle of a collective,",
    "Tensor parallel serving splits each layer over several machines and",
    "Hello",
    "An operator can drain a rail, watch its health, and bring it back",
    "1 2 3 4 5 6 7 8",
    "The sum is computed in the same order on every rank, so",
]


@dataclass
class LoadSpec:
    prompts: list[str] = field(default_factory=lambda: list(DEFAULT_PROMPTS))
    max_tokens: int = 32
    concurrency: int = 4
    duration_s: float | None = None   # None: each prompt once; else cycle prompts until this long
    request_timeout_s: float = 180.0
    deadline_s: float = 600.0


@dataclass
class RequestResult:
    index: int            # order of issue
    prompt_index: int
    ok: bool = False
    error: str | None = None
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stop_reason: object = None  # vLLM's choices[0].stop_reason (an aborted request's reason, say)
    sent_at: float = 0.0       # time.time()
    first_token_at: float | None = None
    finished_at: float | None = None
    gaps_s: list[float] = field(default_factory=list)  # inter-token times
    gap_times: list[float] = field(default_factory=list)  # time.time() at the end of each gap

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.sent_at

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first."""
        if self.first_token_at is None or self.finished_at is None or len(self.token_ids) < 2:
            return None
        return (self.finished_at - self.first_token_at) / (len(self.token_ids) - 1)


@dataclass
class LoadResult:
    spec: LoadSpec
    results: list[RequestResult]
    started_at: float
    ended_at: float

    @property
    def ok(self) -> list[RequestResult]:
        return [r for r in self.results if r.ok]

    @property
    def failed(self) -> list[RequestResult]:
        return [r for r in self.results if not r.ok]

    def gaps(self, start: float | None = None, end: float | None = None) -> list[float]:
        """Inter-token gaps of all requests whose gap ended within [start, end] (wall clock)."""
        out = []
        for r in self.results:
            for g, t in zip(r.gaps_s, r.gap_times):
                if (start is None or t >= start) and (end is None or t <= end):
                    out.append(g)
        return out

    def summary(self) -> dict:
        tokens = sum(len(r.token_ids) for r in self.results)
        wall = max(self.ended_at - self.started_at, 1e-9)
        gaps = self.gaps()
        tpots = [r.tpot_s for r in self.ok if r.tpot_s is not None]
        ttfts = [r.ttft_s for r in self.ok if r.ttft_s is not None]
        return {
            "requests": len(self.results), "ok": len(self.ok), "failed": len(self.failed),
            "errors": sorted({r.error for r in self.failed if r.error})[:5],
            "tokens": tokens, "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 2),
            "ttft_p50_s": percentile(ttfts, 50),
            "tpot_p50_s": percentile(tpots, 50), "tpot_p99_s": percentile(tpots, 99),
            "itl_p50_s": percentile(gaps, 50), "itl_p99_s": percentile(gaps, 99),
            "itl_max_s": max(gaps) if gaps else None,
        }


def run_load(url: str, model: str, spec: LoadSpec | None = None) -> LoadResult:
    """Run the load to completion (blocking); see LoadSpec for the bounds."""
    return asyncio.run(_run(url, model, spec or LoadSpec()))


async def _run(url: str, model: str, spec: LoadSpec) -> LoadResult:
    if not spec.prompts or spec.concurrency < 1 or spec.max_tokens < 1:
        raise ValueError("need at least one prompt, concurrency >= 1 and max_tokens >= 1")
    results: list[RequestResult] = []
    started = time.time()
    stop_issuing = started + spec.duration_s if spec.duration_s else None
    limits = httpx.Limits(max_connections=spec.concurrency + 2)
    timeout = httpx.Timeout(spec.request_timeout_s, connect=10.0)

    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits, trust_env=False) as client:
        counter = iter(range(10**9))

        async def worker() -> None:
            while True:
                i = next(counter)
                if stop_issuing is None:
                    if i >= len(spec.prompts):
                        return
                elif time.time() >= stop_issuing:
                    return
                res = RequestResult(index=i, prompt_index=i % len(spec.prompts))
                results.append(res)
                try:
                    await asyncio.wait_for(_one(client, model, spec, res), spec.request_timeout_s)
                except asyncio.TimeoutError:
                    res.error = f"no complete answer within {spec.request_timeout_s:.0f} s"
                except httpx.HTTPError as exc:
                    res.error = f"{type(exc).__name__}: {exc}"[:300]

        tasks = [asyncio.create_task(worker()) for _ in range(spec.concurrency)]
        done, pending = await asyncio.wait(tasks, timeout=spec.deadline_s)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for t in done:
            if t.exception() is not None:
                raise t.exception()
    for r in results:
        if not r.ok and r.error is None:
            r.error = f"still running at the load deadline ({spec.deadline_s:.0f} s)"
    results.sort(key=lambda r: r.index)
    return LoadResult(spec, results, started, time.time())


async def _one(client: httpx.AsyncClient, model: str, spec: LoadSpec, res: RequestResult) -> None:
    body = {"model": model, "prompt": spec.prompts[res.prompt_index], "max_tokens": spec.max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "return_token_ids": True}
    res.sent_at = last = time.time()
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")
            res.error = f"HTTP {resp.status_code}: {text[:200]}"
            return
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:  # vLLM reports engine errors inside the stream
                res.error = f"stream error: {json.dumps(chunk['error'])[:200]}"
                return
            now = time.time()
            for choice in chunk.get("choices", []):
                ids = choice.get("token_ids") or []
                res.text += choice.get("text") or ""
                if ids:
                    if res.first_token_at is None:  # tokens riding with the first one: no gap
                        res.first_token_at = now
                        n_new, delay = len(ids) - 1, 0.0
                    else:
                        n_new, delay = len(ids), now - last
                    for _ in range(n_new):
                        res.gaps_s.append(delay / n_new)
                        res.gap_times.append(now)
                    res.token_ids.extend(ids)
                    last = now
                if choice.get("finish_reason"):
                    res.finish_reason = choice["finish_reason"]
                    res.stop_reason = choice.get("stop_reason")
    res.finished_at = time.time()
    if len(res.token_ids) != spec.max_tokens:
        why = f": {res.stop_reason}" if res.stop_reason else ""
        res.error = f"got {len(res.token_ids)} tokens, expected {spec.max_tokens} (finish: {res.finish_reason}{why})"
        return
    res.ok = True


def compare(reference: LoadResult, run: LoadResult) -> list[str]:
    """Differences in token ids against the reference, per prompt; [] when identical.

    Only requests that finished in both are compared (failures are counted separately).
    """
    ref = {}
    for r in reference.ok:
        ref.setdefault(r.prompt_index, r.token_ids)
    out = []
    for r in run.ok:
        want = ref.get(r.prompt_index)
        if want is None:
            out.append(f"request {r.index}: prompt {r.prompt_index} has no reference output")
        elif r.token_ids != want:
            at = next((i for i, (a, b) in enumerate(zip(r.token_ids, want)) if a != b),
                      min(len(r.token_ids), len(want)))
            out.append(f"request {r.index} (prompt {r.prompt_index}): tokens differ from position {at}: "
                       f"got {r.token_ids[at:at + 5]}, reference {want[at:at + 5]}")
    return out
