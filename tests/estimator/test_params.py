"""The estimator validates FedEnt's knobs with FedEntOptions, the class the config uses (no copied defaults)."""

from __future__ import annotations

import pytest

from estimator.params import fedent_options
from fedent.config import ConfigError
from fedent.strategies.options import FedEntOptions
from fedentrpc.v1 import estimator_pb2 as est_pb

EXACT, PAPER = est_pb.FEDENT_VARIANT_EXACT, est_pb.FEDENT_VARIANT_PAPER


def test_unset_fields_take_the_options_defaults() -> None:
    opts = fedent_options(est_pb.FedEntParams(beta=0.9, variant=EXACT))
    assert opts == FedEntOptions(beta=0.9, gamma=0.0)  # γ = 0 is a value, not "unset"
    full = fedent_options(est_pb.FedEntParams(beta=0.5, gamma=0.7, variant=PAPER), eps1=0.1, eps2=0.2, max_sweeps=3)
    assert full == FedEntOptions(beta=0.5, gamma=0.7, variant="paper", eps1=0.1, eps2=0.2, max_sweeps=3)


@pytest.mark.parametrize(
    "params, algo1, needle",
    [
        (est_pb.FedEntParams(variant=EXACT), {}, "params.beta: must be in (0, 1), got 0.0"),
        (est_pb.FedEntParams(beta=0.9, gamma=1.5, variant=EXACT), {}, "params.gamma: must be in [0, 1]"),
        (est_pb.FedEntParams(beta=0.9), {}, "params.variant: FEDENT_VARIANT_UNSPECIFIED is not allowed; send one "
                                            "of FEDENT_VARIANT_EXACT, FEDENT_VARIANT_PAPER"),
        (est_pb.FedEntParams(beta=0.9, variant=7), {}, "params.variant: value 7 is not allowed"),  # type: ignore[arg-type]
        (est_pb.FedEntParams(beta=0.9, variant=EXACT), {"eps1": -1.0}, "request.eps1: must be > 0"),
        (est_pb.FedEntParams(beta=0.9, variant=EXACT), {"max_sweeps": -2}, "request.max_sweeps: must be >= 1"),
    ],
)
def test_bad_values_are_value_errors_keyed_by_the_request_field(params: est_pb.FedEntParams, algo1: dict[str, float],
                                                                 needle: str) -> None:
    with pytest.raises(ConfigError) as e:  # a ValueError: the service answers INVALID_ARGUMENT
        fedent_options(params, **algo1)  # type: ignore[arg-type]
    assert isinstance(e.value, ValueError) and needle in str(e.value), str(e.value)
