"""Worker tokens: the server's registry of known token hashes and revocations, and a worker reading its own.

Tokens are hashed on load and compared with ``hmac.compare_digest``; only hashes stay in memory. The
revocation list is re-read whenever the tokens file changes, so a worker can be shut out mid-run.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedentrpc.security.errors import SecurityConfigError

log = logging.getLogger("fedent.security")


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _parse_tokens(data: Any, where: str) -> tuple[dict[str, str], frozenset[str]]:
    """``{"workers": {id: token | "sha256:<hex>"}, "revoked": [id, ...]}`` -> (id -> hash, revoked)."""
    if not isinstance(data, dict) or not isinstance(data.get("workers"), dict):
        raise SecurityConfigError(f"{where}: expected {{\"workers\": {{id: token}}, \"revoked\": [...]}}")
    hashes: dict[str, str] = {}
    for wid, value in data["workers"].items():
        if not isinstance(value, str) or not value:
            raise SecurityConfigError(f"{where}: worker {wid!r} has no token")
        if value.startswith("sha256:"):
            digest = value[len("sha256:"):].lower()
            if not re.fullmatch(r"[0-9a-f]{64}", digest):
                raise SecurityConfigError(f"{where}: worker {wid!r} has a malformed sha256 token hash")
            hashes[str(wid)] = digest
        else:
            hashes[str(wid)] = token_hash(value)
    revoked = data.get("revoked") or []
    if not isinstance(revoked, list) or not all(isinstance(r, str) for r in revoked):
        raise SecurityConfigError(f"{where}: 'revoked' must be a list of worker ids")
    return hashes, frozenset(revoked)


class TokenRegistry:
    """Known workers' token hashes and the revocation list, reloaded when the tokens file changes.

    Only hashes are kept in memory. A reload that fails to parse keeps the previous registry (and logs
    it), so a half-edited file cannot lock every worker out or let everyone in.
    """

    def __init__(self, path: str | Path, min_reload_interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self.min_reload_interval_s = min_reload_interval_s
        self._clock = clock
        self._hashes: dict[str, str] = {}
        self._revoked: frozenset[str] = frozenset()
        self._stamp: tuple[int, int] | None = None
        self._checked_at = float("-inf")
        self.reload(strict=True)

    @property
    def workers(self) -> list[str]:
        return sorted(self._hashes)

    @property
    def revoked(self) -> frozenset[str]:
        return self._revoked

    def reload(self, strict: bool = False) -> bool:
        """Re-read the file; returns whether it changed. ``strict``: errors raise instead of being logged."""
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return False
            if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                log.warning("tokens file %s is readable by group/others; chmod 600 it", self.path)
            data = json.loads(self.path.read_text())
            hashes, revoked = _parse_tokens(data, str(self.path))
        except (OSError, json.JSONDecodeError, SecurityConfigError) as e:
            msg = str(e) if isinstance(e, SecurityConfigError) else f"{self.path}: unreadable ({e.__class__.__name__})"
            if strict:
                raise SecurityConfigError(msg) from None
            log.error("keeping the previous worker tokens: %s", msg)
            return False
        changed = self._stamp is not None
        self._hashes, self._revoked, self._stamp = hashes, revoked, stamp
        if changed:
            log.info("reloaded worker tokens from %s: %d workers, %d revoked", self.path, len(hashes), len(revoked))
        return True

    def reload_if_due(self) -> None:
        now = self._clock()
        if now - self._checked_at >= self.min_reload_interval_s:
            self._checked_at = now
            self.reload()

    def identify(self, token: str) -> str | None:
        """The worker owning ``token`` (revoked or not), comparing hashes in constant time."""
        probe = token_hash(token)
        found = None
        for wid, h in self._hashes.items():  # no early exit: timing does not reveal the match position
            if hmac.compare_digest(probe, h):
                found = wid
        return found

    def is_known(self, worker: str) -> bool:
        return worker in self._hashes

    def is_revoked(self, worker: str) -> bool:
        return worker in self._revoked


def read_worker_token(path: str | Path, worker: str | None = None) -> str:
    """A worker's own token from a file: a tokens.json (picked by ``worker``) or a file holding just it."""
    p = Path(path)
    try:
        text = p.read_text().strip()
    except OSError as e:
        raise SecurityConfigError(f"cannot read token file {p} ({e.strerror})") from None
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            raise SecurityConfigError(f"{p}: not valid JSON") from None
        workers = data.get("workers") if isinstance(data, dict) else None
        if not isinstance(workers, dict):
            raise SecurityConfigError(f"{p}: no 'workers' mapping")
        if worker is None:
            raise SecurityConfigError(f"{p} holds several workers' tokens: say which worker this is "
                                      f"(the worker's --name)")
        token = workers.get(worker)
        if not isinstance(token, str) or not token or token.startswith("sha256:"):
            raise SecurityConfigError(f"{p} has no usable token for worker {worker!r}")
        return token
    if not text or any(c.isspace() for c in text):
        raise SecurityConfigError(f"{p} must hold exactly one token")
    return text
