"""Bearer tokens of the admin API: the mutation token (R2CC_ADMIN_TOKEN or R2CC_ADMIN_TOKEN_FILE)
and who may read (R2CC_ADMIN_READ_TOKEN, vLLM's --api-key, the mutation token)."""

from __future__ import annotations

import hashlib
import hmac

from fastapi import Header, HTTPException

from r2cc_serve import envs
from r2cc_serve.errors import UserError


def configured_token() -> str | None:
    token = envs.get("R2CC_ADMIN_TOKEN")
    path = envs.get("R2CC_ADMIN_TOKEN_FILE")
    if not token and path:
        try:
            with open(path) as f:
                token = f.read().strip()
        except OSError as exc:
            raise UserError(f"R2CC_ADMIN_TOKEN_FILE={path}: cannot read it ({exc.strerror})") from None
    return token or None


NO_TOKEN = "no admin token is configured"


def fingerprint(token: str | None) -> str:
    """Who acted, for audit events and decisions: the first 8 hex digits of the token's sha256
    ("none" without a token). Tells tokens apart without revealing them."""
    return hashlib.sha256(token.encode()).hexdigest()[:8] if token else "none"


def presented_fingerprint(authorization: str | None) -> str:
    """The fingerprint of the token an `Authorization` header carries (also a wrong one)."""
    if not authorization:
        return "none"
    scheme, _, credential = authorization.partition(" ")
    return fingerprint(credential if scheme.lower() == "bearer" else authorization)


def token_or_reason() -> tuple[str | None, str]:
    """(token, "") or, when none can be had, (None, why): for servers that must not die over it
    (vLLM's API server keeps serving; mutations then answer 403 with the reason)."""
    try:
        token = configured_token()
    except UserError as exc:
        return None, str(exc)
    return token, "" if token else NO_TOKEN


def token_checker(token: str | None, why_none: str = NO_TOKEN):
    """A FastAPI dependency that admits only `Authorization: Bearer <token>`."""

    # async, so FastAPI checks it on the event loop instead of hopping to its thread pool.
    async def check(authorization: str | None = Header(default=None, description="Bearer <admin token>")) -> None:
        if token is None:
            raise HTTPException(403, f"mutations are disabled: {why_none}; set R2CC_ADMIN_TOKEN "
                                     "or R2CC_ADMIN_TOKEN_FILE where the admin API runs")
        if not authorization or not hmac.compare_digest(authorization.encode(), f"Bearer {token}".encode()):
            raise HTTPException(401, "missing or wrong bearer token (Authorization: Bearer <R2CC_ADMIN_TOKEN>)",
                                headers={"WWW-Authenticate": "Bearer"})

    return check


# What a reader sees: everything, or the same without the audit detail (client addresses and
# token fingerprints), which needs the mutation token once reads are closed.
FULL, NO_AUDIT_DETAIL = "full", "no-audit-detail"
REDACTED = "redacted"


def configured_read_token() -> str | None:
    return envs.get("R2CC_ADMIN_READ_TOKEN") or None


def _bearer(authorization: str | None) -> bytes | None:
    scheme, _, credential = (authorization or "").partition(" ")
    return credential.strip().encode() if scheme.lower() == "bearer" and credential.strip() else None


def _matches(credential: bytes, tokens) -> bool:
    """Constant time in the tokens' contents: every token is compared, the first hit does not stop it."""
    hit = False
    for t in tokens:
        hit |= hmac.compare_digest(credential, t.encode())
    return hit


def read_access(authorization: str | None, admin_token: str | None, read_tokens: list[str]) -> str | None:
    """FULL, NO_AUDIT_DETAIL, or None (refused) for a GET with this `Authorization` header.
    read_tokens: R2CC_ADMIN_READ_TOKEN and vLLM's API keys; none of them: reads are open, as
    they always were."""
    credential = _bearer(authorization)
    if credential is not None and admin_token and _matches(credential, [admin_token]):
        return FULL
    if not read_tokens:
        return FULL
    return NO_AUDIT_DETAIL if credential is not None and _matches(credential, read_tokens) else None


def read_refusal(read_tokens_named: list[str]) -> str:
    """The 401's text: what to send, never what the API holds."""
    return ("reads of this admin API need a token: send Authorization: Bearer <token>, the token being "
            + " or ".join(read_tokens_named + ["R2CC_ADMIN_TOKEN"]))
