"""What r2cc does with vLLM's fault-tolerance mode (`vllm serve --enable-fault-tolerance`).

An r2cc group gives up when every rail to a peer stayed down past R2CC_ALL_RAILS_DOWN_GRACE_MS
(no fallback rail): the collective raises on every rank. Then:

- without the flag vLLM's engine stops, as before; the error says the flag exists;
- with it, vLLM keeps the engine (unhealthy), aborts the requests in flight (their
  stop_reason is r2cc's error, naming the rails), and resumes on `retry`: each worker then
  re-forms its r2cc groups (a new group of the same name, met in a fresh part of the store);
  a retry while no rail is back fails and leaves the engine unhealthy.
  R2CC_FT_AUTO_RETRY (on by default) makes r2cc send that retry itself, from vLLM's API
  server through the same EngineClient call as POST /fault_tolerance/apply, every
  R2CC_FT_RETRY_INTERVAL_S; off, an operator's POST /fault_tolerance/apply does it.

This module is the policy and the words; every vLLM internal it needs is in compat.py.
"""

from __future__ import annotations

import logging
import re

from r2cc_serve import envs

# A child of vLLM's "vllm" logger: its lines get vLLM's format and process prefix ("(APIServer
# pid=..)", "(Worker_TP1 pid=..)") in every vLLM process, where other loggers may be silent.
log = logging.getLogger("vllm.r2cc_serve.fault_tolerance")

# Every message of a group that gave up starts with this, so the engine can tell r2cc's
# faults (which a retry can cure once a rail is back) from any other exception.
GAVE_UP = "r2cc group gave up"

FLAG = "--enable-fault-tolerance"


def _rail_lines(rail_stats: list[dict], peer: int) -> str:
    """`rail0 10.206.0.1 (down: Connection timed out)`, ... for this rank's rails to `peer`."""
    parts = []
    for s in sorted((s for s in rail_stats if s.get("peer") == peer), key=lambda s: s.get("rail", 0)):
        why = s.get("last_error") or ""
        state = s.get("state", "?")
        parts.append(f"{s.get('interface', 'rail' + str(s.get('rail')))} {s.get('address', '?')} "
                     f"({state}{': ' + why if why else ''})")
    return ", ".join(parts) if parts else "no rails"


def explain(error: BaseException, *, group: str, rank: int, global_rank: int, rail_stats: list[dict],
            peers: list[int], ft_enabled: bool, auto_retry: bool) -> str:
    """One line: r2cc's error, the rails of this rank to each peer, and what happens next."""
    kind = getattr(error, "kind", "aborted")
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    rails = "; ".join(f"to rank {p}: {_rail_lines(rail_stats, p)}" for p in peers)
    head = f"{GAVE_UP} ({group}, kind {kind}, rank {rank} = global rank {global_rank}): {first} Rails {rails}."
    if ft_enabled:
        how = ("r2cc retries by itself every "
               f"{envs.get('R2CC_FT_RETRY_INTERVAL_S'):g} s (R2CC_FT_AUTO_RETRY=1)" if auto_retry else
               "POST /fault_tolerance/apply {\"instruction\": \"retry\"} does it (R2CC_FT_AUTO_RETRY=0)")
        tail = (f" vLLM runs with {FLAG}: the engine stays up (unhealthy), requests in flight are aborted, "
                f"and it resumes once a rail is back and the group re-forms; {how}.")
    else:
        tail = (f" vLLM's engine stops on this error and must be restarted. Start vLLM with {FLAG} to keep "
                "the engine up and resume it (no restart, no model reload) once a rail is back.")
    return (head + tail).replace("\n", " ")


_WORKER_FAILED = re.compile(r"Worker failed with error '(.*)', please check", re.S)


def fault_reason(exc: BaseException) -> str | None:
    """r2cc's explanation inside an exception the engine's busy loop raised, or None when the
    fault is not a group that gave up (vLLM wraps a worker's error in a RuntimeError)."""
    text = str(exc)
    if GAVE_UP not in text:
        return None
    m = _WORKER_FAILED.search(text)
    text = m.group(1) if m else text
    return text[text.index(GAVE_UP):].strip()


def auto_retry_wanted(reason: str | None) -> bool:
    """Whether r2cc itself should send `retry` for a fault whose fault_info is `reason`."""
    return bool(reason) and GAVE_UP in reason and envs.get("R2CC_FT_AUTO_RETRY")


async def watch_engine(engine_client, make_request, *, auto_retry: bool, on_resumed=None, poll_s: float = 0.1,
                       say=log.warning) -> None:
    """In vLLM's API server (the r2cc endpoint plugin), with --enable-fault-tolerance: follow the
    engine's fault-tolerance status and, when it is healthy again after being unhealthy (whoever
    sent the retry), call on_resumed() (the admin API forgets the old groups' agents).

    auto_retry: while the engine is unhealthy because an r2cc group gave up, send vLLM's `retry`
    through EngineClient.handle_fault, the call behind POST /fault_tolerance/apply, every
    R2CC_FT_RETRY_INTERVAL_S until one succeeds. A retry takes up to R2CC_FT_REFORM_TIMEOUT_S
    while no rail is back. make_request(request_id) builds vLLM's FaultToleranceRequest.

    get_status reads a cache the engine pushes to, so polling costs nothing. Runs until cancelled.
    """
    import asyncio
    import time
    import uuid

    interval = max(0.05, envs.get("R2CC_FT_RETRY_INTERVAL_S"))
    attempts, since = 0, None
    while True:
        try:
            status = await engine_client.get_status()
            engine = (status.get("engines") or [{}])[0]
        except Exception as exc:  # noqa: BLE001 - the engine may be gone; nothing to resume
            log.debug("r2cc: fault-tolerance status unavailable: %s", exc)
            await asyncio.sleep(1.0)
            continue
        state = engine.get("status")
        if state != "unhealthy":
            if since is not None and state == "healthy":
                say("r2cc: engine healthy again %.1f s after it went unhealthy%s", time.monotonic() - since,
                    f" (automatic retry {attempts})" if attempts else "")
                if on_resumed is not None:
                    on_resumed()
            attempts, since = 0, None
            await asyncio.sleep(poll_s)
            continue
        since = since or time.monotonic()
        if not (auto_retry and auto_retry_wanted(engine.get("fault_info"))):
            await asyncio.sleep(poll_s)
            continue
        attempts += 1
        request_id = f"r2cc-auto-{uuid.uuid4().hex[:12]}"
        try:
            result = await engine_client.handle_fault(make_request(request_id))
            ok, why = bool(result.success), result.reason
        except Exception as exc:  # noqa: BLE001 - try again after the interval
            ok, why = False, f"{type(exc).__name__}: {exc}"
        if ok:
            continue  # the status cache says healthy at the next look
        if attempts == 1 or attempts % 10 == 0:
            say("r2cc: automatic retry %d: engine still unhealthy (%s); next in %.1f s",
                attempts, (why or "")[:300], interval)
        await asyncio.sleep(interval)


def recover_groups(communicators: list, tag: str) -> dict:
    """In a worker, on vLLM's retry: re-form every r2cc group of this process.

    Returns {"ok": bool, "groups": [...], "error": str}; never raises, so a retry while the
    rails are still down is one warning line per rank instead of a traceback.
    """
    timeout_s = envs.get("R2CC_FT_REFORM_TIMEOUT_S")
    done, errors = [], []
    for c in communicators:
        try:
            c.recover_from_fault(tag, timeout_s)
            done.append(c.unique_name)
        except Exception as exc:  # noqa: BLE001 - reported to the engine, which stays unhealthy
            errors.append(f"{c.unique_name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    if errors:
        log.warning("r2cc: retry %s: group not re-formed yet (%s); the engine stays unhealthy", tag, "; ".join(errors))
    elif done:
        log.warning("r2cc: retry %s: re-formed %s", tag, ", ".join(done))
    return {"ok": not errors, "groups": done, "error": "; ".join(errors)}
