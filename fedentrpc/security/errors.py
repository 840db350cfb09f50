"""The error every security setting raises, kept apart so each concern's module can raise it without
importing another's."""

from __future__ import annotations


class SecurityConfigError(ValueError):
    """Inconsistent or unusable security settings (one-line message for the CLI)."""
