"""AggregatorSettings: declared fields (fedent.config.Declared), every bad value and unknown key named."""

from __future__ import annotations

import typing

import pytest

from fedentrpc import codec, mappers, model_delta
from server.settings import AggregatorSettings, SettingsError


@pytest.mark.parametrize("key, value, why", [
    ("port", 70000, "port: must be in [0, 65535], got 70000"),
    ("quorum", 1.5, "quorum: must be in [0, 1], got 1.5"),
    ("round_deadline_s", 0, "round_deadline_s: must be > 0, got 0.0"),
    ("round_retries", -2, "round_retries: must be >= -1, got -2"),
    ("max_workers", 4, "max_workers: must be >= 8, got 4"),
    ("chunk_bytes", codec.MAX_CHUNK_BYTES + 1, f"chunk_bytes: must be in [1, {codec.MAX_CHUNK_BYTES}]"),
    ("wire_dtype", "int8", "wire_dtype: must be one of native, float16, bfloat16, got 'int8'"),
    ("heartbeat_misses", "3", "heartbeat_misses: expected an integer, got '3'"),
    ("max_anonymous_streams", 0, "max_anonymous_streams: must be >= 1, got 0"),
    ("stream_idle_s", 0, "stream_idle_s: must be > 0, got 0.0"),
    ("open_stream_max_s", -1, "open_stream_max_s: must be > 0, got -1.0"),
])
def test_a_bad_value_names_the_setting(key: str, value: object, why: str) -> None:
    with pytest.raises(SettingsError) as e:
        AggregatorSettings(**{key: value})  # type: ignore[arg-type]
    assert isinstance(e.value, ValueError) and why in str(e.value) and "\n" not in str(e.value)


def test_every_bad_setting_is_reported_at_once() -> None:
    with pytest.raises(SettingsError) as e:
        AggregatorSettings(port=-1, quorum=2.0, compression="gzip")  # type: ignore[arg-type]
    assert [p.split(":")[0] for p in e.value.problems] == ["port", "quorum", "compression"]


def test_unknown_keys_are_errors_naming_them() -> None:
    with pytest.raises(SettingsError, match=r"unknown AggregatorSettings key\(s\) deadline, speed; allowed: .*quorum"):
        AggregatorSettings.from_mapping({"deadline": 3, "speed": 1, "quorum": 0.5})
    assert AggregatorSettings.from_mapping({"quorum": 1, "port": 5}).quorum == 1.0  # ints taken as floats


def test_the_transfer_choices_are_the_codecs() -> None:
    hints = typing.get_type_hints(AggregatorSettings)
    assert set(typing.get_args(hints["wire_dtype"])) == set(codec.WIRE_DTYPES)
    assert set(typing.get_args(hints["compression"])) == set(codec.COMPRESSIONS)
    assert set(typing.get_args(hints["download_encoding"])) == set(model_delta.DOWNLOAD_ENCODINGS) == \
        set(mappers.DOWNLOAD_ENCODINGS)


def test_download_settings_are_checked() -> None:
    assert AggregatorSettings().download_encoding == "full"  # whole models unless asked
    with pytest.raises(SettingsError, match="download_encoding: must be one of full, delta"):
        AggregatorSettings(download_encoding="xor")  # type: ignore[arg-type]
    with pytest.raises(SettingsError, match="delta_history"):
        AggregatorSettings(delta_history=0)


def test_every_setting_is_documented() -> None:
    assert all(AggregatorSettings.docs().values())


def test_the_stream_limits_come_from_the_settings_and_their_flags() -> None:
    import argparse

    from fedentrpc.stream_limit import StreamLimits
    from server.__main__ import add_settings_args, settings_from_args

    assert AggregatorSettings().stream_limits() == StreamLimits(per_identity=16, anonymous=8, idle_s=120.0,
                                                                open_max_s=600.0)
    p = argparse.ArgumentParser()
    add_settings_args(p)
    args = p.parse_args(["--max-streams-per-identity", "5", "--max-anonymous-streams", "3", "--stream-idle", "7",
                         "--open-stream-max", "9"])
    assert settings_from_args(args).stream_limits() == StreamLimits(per_identity=5, anonymous=3, idle_s=7.0,
                                                                    open_max_s=9.0)
