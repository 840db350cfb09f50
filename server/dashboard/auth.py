"""Optional bearer-token check for the dashboard's data routes.

Tokens are compared in constant time and never written into a response, a log line or the page.
"""

from __future__ import annotations

import hmac

from fastapi import HTTPException, Request, status
from fastapi.security import HTTPBearer

bearer_scheme = HTTPBearer(auto_error=False, description="Required only when the dashboard runs with --token")

UNAUTHORIZED = HTTPException(
    status_code=status.HTTP_401_UNAUTHORIZED,
    detail="missing or invalid bearer token",
    headers={"WWW-Authenticate": "Bearer"},
)


def token_matches(expected: str, given: str | None) -> bool:
    if given is None:
        return False
    return hmac.compare_digest(expected.encode("utf-8"), given.encode("utf-8"))


def presented_token(request: Request, allow_query: bool) -> str | None:
    """The token from ``Authorization: Bearer``, or (only where allowed: SSE) from ``?token=``."""
    header = request.headers.get("authorization")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    if allow_query:
        return request.query_params.get("token")
    return None


def check(expected: str | None, request: Request, allow_query: bool = False) -> None:
    """Raise 401 unless no token is configured or the request presents the right one."""
    if expected is None:
        return
    if not token_matches(expected, presented_token(request, allow_query)):
        raise UNAUTHORIZED
