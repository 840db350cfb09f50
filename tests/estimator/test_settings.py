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
    ("max_anonymous_streams", 0, "max_anonymous_streams: must be >= 1, got 0"),
    ("stream_idle_s", -1, "stream_idle_s: must be > 0, got -1.0"),
    ("open_stream_max_s", 0, "open_stream_max_s: must be > 0, got 0.0"),
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


def test_the_stream_limits_come_from_the_settings_and_their_flags() -> None:
    from estimator.__main__ import build_parser, settings_from_args
    from fedentrpc.stream_limit import StreamLimits

    assert EstimatorSettings().stream_limits() == StreamLimits(per_identity=8, anonymous=8, idle_s=120.0,
                                                               open_max_s=600.0)
    args = build_parser().parse_args(["--insecure", "--max-anonymous-streams", "2", "--stream-idle", "4.5",
                                      "--open-stream-max", "30"])
    assert settings_from_args(args).stream_limits() == StreamLimits(per_identity=8, anonymous=2, idle_s=4.5,
                                                                    open_max_s=30.0)
