"""Bearer token for the admin API's mutations (R2CC_ADMIN_TOKEN or R2CC_ADMIN_TOKEN_FILE)."""

from __future__ import annotations

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


def token_checker(token: str | None):
    """A FastAPI dependency that admits only `Authorization: Bearer <token>`."""

    def check(authorization: str | None = Header(default=None, description="Bearer <admin token>")) -> None:
        if token is None:
            raise HTTPException(403, "mutations are disabled: no admin token is configured; set R2CC_ADMIN_TOKEN "
                                     "or R2CC_ADMIN_TOKEN_FILE where the admin API runs")
        if not authorization or not hmac.compare_digest(authorization.encode(), f"Bearer {token}".encode()):
            raise HTTPException(401, "missing or wrong bearer token (Authorization: Bearer <R2CC_ADMIN_TOKEN>)",
                                headers={"WWW-Authenticate": "Bearer"})

    return check
