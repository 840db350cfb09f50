"""WorkerSettings (client/settings.py): declared fields, every bad value and unknown key named."""

from __future__ import annotations

import pytest

from client.settings import SettingsError, WorkerSettings

OK = {"aggregator": "127.0.0.1:1", "client_ids": (0, 1)}


@pytest.mark.parametrize("change, why", [
    ({"connect_timeout_s": 0}, "connect_timeout_s: must be > 0, got 0.0"),
    ({"reconnect_attempts": -1}, "reconnect_attempts: must be >= 0, got -1"),
    ({"reconnect_window_s": 0.0}, "reconnect_window_s: must be > 0, got 0.0"),
    ({"backoff_base_s": 0}, "backoff_base_s: must be > 0, got 0.0"),
    ({"backoff_base_s": 20.0}, "backoff_base_s: must be <= backoff_cap_s (15), got 20"),
    ({"client_ids": ()}, "client_ids: a worker must host at least one client"),
    ({"aggregator": "localhost"}, "aggregator: must be HOST:PORT, got 'localhost'"),
    ({"label_histogram": "yes"}, "label_histogram: expected true/false, got 'yes'"),
    ({"executor": "gpu"}, "executor: must be one of auto, sequential, vectorised, got 'gpu'"),
    ({"max_parallel_clients": 0}, "max_parallel_clients: must be >= 1 or null, got 0"),
])
def test_a_bad_value_names_the_setting(change: dict[str, object], why: str) -> None:
    with pytest.raises(SettingsError) as e:
        WorkerSettings(**{**OK, **change})  # type: ignore[arg-type]
    assert isinstance(e.value, ValueError) and str(e.value) == why


def test_unknown_keys_are_errors_naming_them() -> None:
    with pytest.raises(SettingsError, match=r"unknown WorkerSettings key\(s\) retries; allowed: .*reconnect_attempts"):
        WorkerSettings.from_mapping({**OK, "retries": 3})
    assert WorkerSettings.from_mapping({**OK, "connect_timeout_s": 5}).connect_timeout_s == 5.0


def test_the_worker_module_uses_these_settings() -> None:
    from client import worker

    assert worker.WorkerSettings is WorkerSettings
    assert all(WorkerSettings.docs().values())
