"""Turning expected failures into one-line CLI errors (and their exit codes) without a traceback."""

from __future__ import annotations

from fedent.config import ConfigError, ExperimentConfig


def input_error_types() -> tuple[type[BaseException], ...]:
    """Errors that mean "fix your inputs" (exit 2): missing or unreadable dataset files."""
    try:
        from fedent.data import DatasetError
    except ImportError:  # the data package is optional for this check
        return (FileNotFoundError,)
    return (DatasetError, FileNotFoundError)


def check_device(cfg: ExperimentConfig, device: str | None) -> None:
    """Fail before any work when the requested device does not exist (a config error, not a crash)."""
    from fedent.trainer import resolve_device  # torch: imported when a command runs, not for --help

    try:
        resolve_device(device or cfg.train.device)
    except (ValueError, RuntimeError) as e:
        raise ConfigError(one_line(e)) from None


def one_line(e: BaseException) -> str:
    """The first line of an exception's message, or its type name when the message is empty."""
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def set_threads(threads: int | None) -> None:
    """Apply a CLI --threads flag (the process-wide torch setting belongs to the command, not the core)."""
    if threads is None:
        return
    if threads < 1:
        raise ConfigError("--threads: must be >= 1")
    import torch

    torch.set_num_threads(threads)
