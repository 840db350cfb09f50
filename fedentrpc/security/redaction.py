"""Scrubbing bearer tokens and secrets from log lines and configs, so secrets never leak through logs,
the dashboard or the run directory. Pure text processing: no gRPC."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "***"
_BEARER = re.compile(r"(?i)\b(bearer)(\s+|%20|\+)[A-Za-z0-9._~+/=-]+")
_AUTH_KV = re.compile(r"(?i)(['\"]?(?:authorization|token)['\"]?\s*[:=]\s*['\"]?)(?!bearer\b)([A-Za-z0-9._~+/=-]{8,})")
_SECRET_KEY = re.compile(
    r"(?i)(token|secret|password|passwd|credential|private|api[_-]?key|authorization|(^|[_.-])key($|[_.-]))"
)


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with bearer tokens, ``token=...``/``authorization: ...`` values and given secrets replaced."""
    out = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    out = _AUTH_KV.sub(lambda m: f"{m.group(1)}{REDACTED}", out)
    for s in secrets:
        if s and len(s) >= 8:
            out = out.replace(s, REDACTED)
    return out


class RedactingFilter(logging.Filter):
    """A logging filter that rewrites each record's final message with :func:`redact_text`.

    Attach it to handlers (``install_log_redaction``): a filter on a logger does not see records that
    propagate from child loggers, a filter on the handler sees everything it will print.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets: set[str] = {s for s in secrets if s}

    def add_secret(self, secret: str) -> None:
        if secret:
            self.secrets.add(secret)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it to the formatter's own error path
            return True
        clean = redact_text(message, self.secrets)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text, self.secrets)
        return True


def install_log_redaction(secrets: Iterable[str] = (), logger: logging.Logger | None = None) -> RedactingFilter:
    """Attach one :class:`RedactingFilter` to every handler of ``logger`` (default: root) and to the logger."""
    target = logger or logging.getLogger()
    filt = RedactingFilter(secrets)
    target.addFilter(filt)
    for h in target.handlers:
        h.addFilter(filt)
    return filt


def redact_config(obj: Any) -> Any:
    """A copy of a nested config for display: secret-looking keys become ``***``, strings are scrubbed."""
    if isinstance(obj, Mapping):
        return {k: (REDACTED if _SECRET_KEY.search(str(k)) and v not in (None, "", False)
                    else redact_config(v)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_config(v) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj
