"""The audit trail of admin mutations: every drain, undrain, failover and restore request,
allowed or refused, becomes

  - an event of kind "admin" in GET /r2cc/v1/events, beside the rails' events,
  - one log line (logger r2cc_serve.admin, level WARNING),
  - a count in r2cc_admin_mutations_total{action,result} (admin/metrics.py).

Who asked is a fingerprint of the token presented (auth.fingerprint), never the token itself.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time

from r2cc_serve.admin.auth import presented_fingerprint

log = logging.getLogger("r2cc_serve.admin")

MAX_EVENTS = 256
TEXT_MAX_CHARS = 200  # host, reason and detail as recorded: what was asked, cut to a sane length
# Few values, so the counter's label set stays small.
RESULTS = {401: "unauthorized", 403: "forbidden", 404: "not_found", 409: "conflict", 422: "invalid",
           502: "partial", 503: "unavailable"}
_TRUE, _FALSE = {"1", "true", "t", "yes", "y", "on"}, {"0", "false", "f", "no", "n", "off"}


def result_of(status: int) -> str:
    return "ok" if 200 <= status < 300 else RESULTS.get(status, "error")


class AuditLog:
    def __init__(self):
        self._lock = threading.Lock()
        self._events: collections.deque = collections.deque(maxlen=MAX_EVENTS)
        self._counts: collections.Counter = collections.Counter()

    def record(self, action: str, request, status: int, body: bytes) -> dict:
        """Note one mutation request (a starlette Request) and the answer it got."""
        params, query = request.path_params, request.query_params
        rail = str(params.get("rail", ""))
        force = (query.get("force") or "false").lower()
        ev = {"time": time.time(), "kind": "admin", "action": action,
              "host": str(params.get("host", ""))[:TEXT_MAX_CHARS],
              "rail": int(rail) if rail.isdigit() and len(rail) < 10 else None,
              "force": True if force in _TRUE else False if force in _FALSE else None,
              "reason": (query.get("reason") or None) and query["reason"][:TEXT_MAX_CHARS],
              "by": presented_fingerprint(request.headers.get("authorization")),
              "client": request.client.host if request.client else "unknown",
              "status": status, "result": result_of(status), "detail": _detail(status, body)[:TEXT_MAX_CHARS]}
        with self._lock:
            self._events.append(ev)
            self._counts[(action, ev["result"])] += 1
        log.warning("r2cc admin audit: %s", line(ev))
        return ev

    def events(self) -> list[dict]:
        with self._lock:
            return list(self._events)

    def counts(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)


def line(ev: dict) -> str:
    """The log line of an audit event; text fields JSON-quoted, so no input can forge a line."""
    q = json.dumps
    return (f"{ev['action']} host={q(ev['host'])} rail={ev['rail']} force={q(ev['force'])} reason={q(ev['reason'])} "
            f"by={ev['by']} from={ev['client']} -> {ev['status']} {ev['result']}: {q(ev['detail'])}")


def _detail(status: int, body: bytes) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        return body[:TEXT_MAX_CHARS].decode(errors="replace")
    if not isinstance(doc, dict):
        return ""
    if 200 <= status < 300:
        return f"{doc.get('state')} on ranks {doc.get('ranks')}" + "".join(f"; {w}" for w in doc.get("warnings", []))
    detail = doc.get("detail", "")
    if isinstance(detail, list):  # a validation error: where and what
        detail = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ())[1:])}: {e.get('msg', '')}"
                           for e in detail if isinstance(e, dict))
    return str(detail)
