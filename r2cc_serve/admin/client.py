"""The command line's side of the admin API (`r2cc rails` and its actions): which API (--url,
else the one on this host), with which token, and a one-line error for whatever goes wrong,
never a traceback. Every call has a timeout: a stuck server cannot hang an operator's shell."""

from __future__ import annotations

import contextlib
from typing import Iterator
from urllib.parse import quote

from r2cc_serve.errors import UserError

DEFAULT_PORT = 8470       # `r2cc admin --port`'s default
VLLM_DEFAULT_PORT = 8000  # `vllm serve --port`'s default
# Where the command looks without --url: `r2cc admin` on this host, then vLLM's default port.
LOCAL_CANDIDATES = (f"http://127.0.0.1:{DEFAULT_PORT}", f"http://127.0.0.1:{VLLM_DEFAULT_PORT}")
PREFIX = "/r2cc/v1"
READ_TIMEOUT_S = 5.0
PROBE_TIMEOUT_S = 1.0
# An action may wait for a fresh read of the agents, for their replies, and for an undo when one
# refused (view.ACTION_TIMEOUT_S, 10 s, each), behind another operator's action.
ACTION_TIMEOUT_S = 45.0

READ_TOKEN_HINT = ("set R2CC_ADMIN_READ_TOKEN (or R2CC_ADMIN_TOKEN) here to the one it takes, "
                   "or vLLM's API key with --token")
ADMIN_TOKEN_HINT = ("set R2CC_ADMIN_TOKEN (or R2CC_ADMIN_TOKEN_FILE) here to the token the admin API "
                    "runs with, or pass --token")


def add_api_options(p, token_help: str, default=None) -> None:
    """--url and --token, on `r2cc rails` and on each of its actions (default=SUPPRESS there, so
    that `r2cc rails --url U drain h1:2` keeps the U given before the action)."""
    p.add_argument("--url", default=default,
                   help="admin API base URL: vLLM's own server (its --port, e.g. http://10.0.0.1:8000) or "
                        f"`r2cc admin`'s; default: whichever answers on this host at {DEFAULT_PORT} "
                        f"(r2cc admin) or {VLLM_DEFAULT_PORT} (vLLM's default port)")
    p.add_argument("--token", default=default, help=token_help)


def read_token(given: str | None) -> str | None:
    """What reads send: --token, else R2CC_ADMIN_READ_TOKEN, else R2CC_ADMIN_TOKEN (it reads too)."""
    from r2cc_serve.admin.auth import configured_read_token, configured_token

    return given or configured_read_token() or configured_token()


def admin_token(given: str | None, action: str) -> str:
    """What an action sends: --token, else R2CC_ADMIN_TOKEN(_FILE); UserError naming them if none."""
    from r2cc_serve.admin.auth import configured_token

    token = given or configured_token()
    if not token:
        raise UserError(f"{action} needs the admin token: {ADMIN_TOKEN_HINT}")
    return token


def _json_or_empty(r) -> dict:
    try:
        doc = r.json()
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def get_doc(client, url: str, key: str, token_hint: str = READ_TOKEN_HINT) -> dict:
    """GET url and return its JSON document, which must have `key`; UserError otherwise."""
    r = client.get(url)
    doc = _json_or_empty(r)
    # /health answers 503 with a normal body when the group is down.
    if r.status_code == 401:
        raise UserError(f"GET {url} answered 401: this admin API needs a token for reads; {token_hint}")
    if key not in doc or r.status_code not in (200, 503):
        raise UserError(f"GET {url} answered HTTP {r.status_code} without an r2cc {key!r} document "
                        f"({r.text[:120]!r}); is this an r2cc admin API (`r2cc admin`, or vLLM started with "
                        "--distributed-backend r2cc)?")
    return doc


def find_local_api(client, candidates=LOCAL_CANDIDATES) -> str:
    """The first candidate base URL whose /r2cc/v1/health answers as r2cc's (401 counts: it is
    there, and the read that follows names the token); UserError naming what was tried."""
    import httpx

    for base in candidates:
        try:
            r = client.get(base + PREFIX + "/health", timeout=PROBE_TIMEOUT_S)
        except httpx.HTTPError:
            continue
        if r.status_code == 401 or (r.status_code in (200, 503) and "status" in _json_or_empty(r)):
            return base
    raise UserError(f"no r2cc admin API answers on this host at {' or '.join(candidates)} (`r2cc admin`, or "
                    "vLLM's default port): give the API server's address, e.g. `r2cc rails --url "
                    "http://127.0.0.1:PORT` with vLLM's --port")


class Api:
    """One admin API at `base` (e.g. http://127.0.0.1:8000), through one kept-alive client."""

    def __init__(self, client, base: str):
        self.client, self.base = client, base.rstrip("/")
        self.url = self.base + PREFIX

    def get(self, path: str, key: str, token_hint: str = READ_TOKEN_HINT) -> dict:
        return get_doc(self.client, self.url + path, key, token_hint)

    def act(self, action: str, host: str, rail: int, force: bool = False, reason: str | None = None) -> dict:
        """POST the action; its ActionResult, or UserError with what the API said and what to do."""
        params = {"force": "true"} if force else {}
        if reason:
            params["reason"] = reason
        r = self.client.post(f"{self.url}/rails/{quote(host, safe='')}/{rail}/{action}", params=params,
                             timeout=ACTION_TIMEOUT_S)
        doc = _json_or_empty(r)
        if r.status_code == 200 and "state" in doc:
            return doc
        what = f"{action} {host} rail{rail} not done"
        if r.status_code == 401:
            raise UserError(f"{what}: the admin API at {self.base} refused the token (401): {ADMIN_TOKEN_HINT}")
        detail = doc.get("detail", r.text[:200])
        if isinstance(detail, list):  # 422: FastAPI's list of what was wrong with which parameter
            detail = "; ".join(f"{e.get('loc', ['?'])[-1]}: {e.get('msg')}" for e in detail if isinstance(e, dict))
        hint = " (here: --force)" if r.status_code == 409 and "force" in str(detail) else ""
        raise UserError(f"{what}: HTTP {r.status_code}: {detail}{hint}")


@contextlib.contextmanager
def connect(url: str | None, token: str | None) -> Iterator[Api]:
    """The API at `url`, else the one on this host (LOCAL_CANDIDATES); a connection that fails
    inside becomes a UserError naming the URL tried and --url."""
    import httpx

    # One kept-alive client: httpx.get() builds a new client (and TLS context) per call, ~80 ms of CPU here.
    client = httpx.Client(timeout=READ_TIMEOUT_S, trust_env=False,
                          headers={"Authorization": f"Bearer {token}"} if token else None)
    try:
        base = url or find_local_api(client)
        try:
            yield Api(client, base)
        except httpx.HTTPError as exc:
            raise UserError(f"cannot reach the admin API at {base} ({type(exc).__name__}); is `r2cc admin` or "
                            "vLLM with --distributed-backend r2cc running there? Point at another with "
                            "--url http://HOST:PORT") from None
    finally:
        client.close()
