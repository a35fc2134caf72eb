"""Bearer token for the admin API's mutations (R2CC_ADMIN_TOKEN or R2CC_ADMIN_TOKEN_FILE)."""

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

    def check(authorization: str | None = Header(default=None, description="Bearer <admin token>")) -> None:
        if token is None:
            raise HTTPException(403, f"mutations are disabled: {why_none}; set R2CC_ADMIN_TOKEN "
                                     "or R2CC_ADMIN_TOKEN_FILE where the admin API runs")
        if not authorization or not hmac.compare_digest(authorization.encode(), f"Bearer {token}".encode()):
            raise HTTPException(401, "missing or wrong bearer token (Authorization: Bearer <R2CC_ADMIN_TOKEN>)",
                                headers={"WWW-Authenticate": "Bearer"})

    return check
