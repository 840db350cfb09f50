"""FedEntOptions on the wire: one mapper pair (fedentrpc.mappers.fedent_options_to_msg / _from_msg) carries the
options whole, and the receiver's errors are structured (field, why), never re-parsed from a message."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from fedent.config import OptionError
from fedent.strategies.options import FedEntOptions
from fedentrpc import codec, mappers
from fedentrpc.v1 import estimator_pb2 as est_pb

# every field away from its default (a field added to FedEntOptions without a value here fails the test below)
NON_DEFAULT = {"beta": 0.5, "gamma": 0.25, "variant": "paper", "estimator": "offline", "eps1": 0.02, "eps2": 0.03,
               "max_sweeps": 7, "probe_batch_size": 16, "eta_max": 0.5, "phi2_rate": "star",
               "offline_clients": "population"}


def test_every_field_round_trips_unchanged_away_from_its_default() -> None:
    default = FedEntOptions()
    fields = {f.name for f in dataclasses.fields(FedEntOptions)}
    assert set(NON_DEFAULT) == fields, "give every FedEntOptions field a non-default value here"
    opts = FedEntOptions(**NON_DEFAULT)  # type: ignore[arg-type]
    for name in fields:
        assert getattr(opts, name) != getattr(default, name), name
    back = mappers.fedent_options_from_msg(est_pb.FedEntParams.FromString(
        mappers.fedent_options_to_msg(opts).SerializeToString()))
    assert back == opts


@pytest.mark.parametrize("nulls", [{"eta_max": None}, {"probe_batch_size": None},
                                   {"eta_max": None, "probe_batch_size": None}])
def test_null_options_travel_as_unset_fields(nulls: dict[str, None]) -> None:
    opts = FedEntOptions(**{**NON_DEFAULT, **nulls})  # type: ignore[arg-type]
    msg = mappers.fedent_options_to_msg(opts)
    for name in nulls:
        assert not msg.HasField(name)
    assert mappers.fedent_options_from_msg(msg) == opts


def test_the_enum_tables_cover_the_options_choices_exactly() -> None:
    hints = typing.get_type_hints(FedEntOptions)
    for name, table in (("variant", mappers.VARIANTS), ("phi2_rate", mappers.PHI2_RATES),
                        ("estimator", mappers.ESTIMATOR_MODES), ("offline_clients", mappers.OFFLINE_CLIENTS)):
        assert set(table) == set(typing.get_args(hints[name])), name
        assert 0 not in table.values(), f"{name}: UNSPECIFIED must not map to a choice"


@pytest.mark.parametrize("name", ["variant", "phi2_rate", "estimator", "offline_clients"])
@pytest.mark.parametrize("value", [0, 99])
def test_a_bad_enum_value_is_a_structured_error_naming_the_field(name: str, value: int) -> None:
    msg = mappers.fedent_options_to_msg(FedEntOptions())
    setattr(msg, name, value)
    with pytest.raises(OptionError) as e:
        mappers.fedent_options_from_msg(msg)
    assert isinstance(e.value, ValueError)  # the service answers INVALID_ARGUMENT
    assert e.value.field == name and [f for f, _ in e.value.fields] == [name]
    assert ("UNSPECIFIED is not allowed" if value == 0 else "value 99 is not allowed") in e.value.why
    assert str(e.value).startswith(f"params.{name}: ")


def test_every_problem_is_reported_keyed_by_the_field() -> None:
    msg = mappers.fedent_options_to_msg(FedEntOptions())
    msg.variant = 0  # type: ignore[assignment]
    msg.phi2_rate = 0  # type: ignore[assignment]
    with pytest.raises(OptionError) as e:
        mappers.fedent_options_from_msg(msg)
    assert [f for f, _ in e.value.fields] == ["variant", "phi2_rate"]
    msg = mappers.fedent_options_to_msg(FedEntOptions())
    msg.beta, msg.max_sweeps = 1.5, 0
    with pytest.raises(OptionError) as e:
        mappers.fedent_options_from_msg(msg, prefix="request")
    assert e.value.fields == [("beta", "must be in (0, 1), got 1.5"), ("max_sweeps", "must be >= 1, got 0")]
    assert str(e.value) == "request.beta: must be in (0, 1), got 1.5; request.max_sweeps: must be >= 1, got 0"


def test_numbers_are_taken_as_sent_not_defaulted() -> None:
    """No second set of defaults: a number left at proto3's 0 is the value 0 (γ = 0 is valid, β = 0 is not)."""
    msg = mappers.fedent_options_to_msg(FedEntOptions())
    msg.gamma = 0.0
    assert mappers.fedent_options_from_msg(msg).gamma == 0.0
    msg.ClearField("beta")
    with pytest.raises(OptionError, match=r"params\.beta: must be in \(0, 1\), got 0\.0"):
        mappers.fedent_options_from_msg(msg)


def test_wire_errors_carry_field_and_why() -> None:
    with pytest.raises(codec.WireError) as e:
        mappers.phase_from_msg(0)
    assert e.value.field == "run status: phase" and e.value.why.startswith("RUN_PHASE_UNSPECIFIED is not allowed")
    assert str(e.value) == f"{e.value.field}: {e.value.why}"
    plain = codec.WireError("no field")
    assert plain.field is None and plain.why == "no field" and str(plain) == "no field"


def test_requests_carry_the_options_whole() -> None:
    opts = FedEntOptions(**NON_DEFAULT)  # type: ignore[arg-type]
    online = mappers.solve_online_request("r", 1, opts, c=1.0, thetas=[1.0], a=[0.1], b=[0.2])
    offline = mappers.start_offline_request("r", opts, init_blob="b", sizes=[3], rounds=2, seed=4, batch_size=8,
                                            base_lr=0.1)
    assert mappers.fedent_options_from_msg(online.params) == opts
    assert mappers.fedent_options_from_msg(offline.params) == opts
