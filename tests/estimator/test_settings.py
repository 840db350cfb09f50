"""EstimatorSettings: declared fields (fedent.config.Declared), every bad value and unknown key named."""

from __future__ import annotations

import pytest

from estimator.settings import EstimatorSettings, SettingsError


@pytest.mark.parametrize("key, value, why", [
    ("port", -1, "port: must be in [0, 65535], got -1"),
    ("max_workers", 1, "max_workers: must be >= 4, got 1"),
    ("oracle_timeout_s", 0, "oracle_timeout_s: must be > 0, got 0.0"),
    ("oracle_retries", -1, "oracle_retries: must be >= 0, got -1"),
    ("oracle_prefetch", 0, "oracle_prefetch: must be >= 1, got 0"),
    ("wait_workers_s", -0.5, "wait_workers_s: must be >= 0, got -0.5"),
    ("blob_cache_bytes", 0, "blob_cache_bytes: must be >= 1, got 0"),
    ("host", "", "host: must not be empty"),
    ("run_dir", 3, "run_dir: expected a string or null, got 3"),
])
def test_a_bad_value_names_the_setting(key: str, value: object, why: str) -> None:
    with pytest.raises(SettingsError) as e:
        EstimatorSettings(**{key: value})  # type: ignore[arg-type]
    assert str(e.value) == why


def test_unknown_keys_are_errors_naming_them() -> None:
    with pytest.raises(SettingsError, match=r"unknown EstimatorSettings key\(s\) prefetch; allowed: .*oracle_prefetch"):
        EstimatorSettings.from_mapping({"prefetch": 3})
    assert EstimatorSettings.from_mapping({"oracle_timeout_s": 5}).oracle_timeout_s == 5.0


def test_every_setting_is_documented() -> None:
    assert all(EstimatorSettings.docs().values())
