"""Removed wire fields stay removed: their numbers and names are reserved in the descriptors, so no later
field can reuse them with another meaning (an old peer would misread it)."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.message import Message

from fedentrpc.v1 import aggregator_pb2 as agg_pb
from fedentrpc.v1 import estimator_pb2 as est_pb

REMOVED: list[tuple[type[Message], dict[str, int]]] = [
    (agg_pb.TaskHeader, {"lr": 5, "epochs": 6, "seed": 7}),
    (agg_pb.UpdateHeader, {"train_s": 8}),
    (est_pb.SolveOnlineResponse, {"eta_star": 4}),
    (est_pb.StartOfflineRequest, {"eps1": 6, "eps2": 7, "max_sweeps": 8}),
    (est_pb.FedEntParams, {"extra": 6}),
]


def _proto(msg: type[Message]) -> descriptor_pb2.DescriptorProto:
    out = descriptor_pb2.DescriptorProto()
    msg.DESCRIPTOR.CopyToProto(out)
    return out


@pytest.mark.parametrize("msg, fields", REMOVED, ids=[m.DESCRIPTOR.name for m, _ in REMOVED])
def test_removed_fields_are_reserved_by_number_and_name(msg: type[Message], fields: dict[str, int]) -> None:
    d = _proto(msg)
    numbers = {n for r in d.reserved_range for n in range(r.start, r.end)}  # end is exclusive
    live = {f.name: f.number for f in d.field}
    for name, number in fields.items():
        assert name not in live and number not in live.values(), f"{msg.DESCRIPTOR.name}.{name} is still a field"
        assert name in d.reserved_name, f"{msg.DESCRIPTOR.name}: name {name!r} not reserved"
        assert number in numbers, f"{msg.DESCRIPTOR.name}: number {number} not reserved"


def test_fedent_params_has_a_field_per_fedent_option() -> None:
    import dataclasses

    from fedent.strategies.options import FedEntOptions

    live = {f.name for f in est_pb.FedEntParams.DESCRIPTOR.fields}
    assert {f.name for f in dataclasses.fields(FedEntOptions)} <= live
