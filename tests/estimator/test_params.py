"""The estimator validates FedEnt's knobs with FedEntOptions, the class the config uses (no copied defaults)."""

from __future__ import annotations

import pytest

from estimator.params import fedent_options
from fedent.config import ConfigError
from fedent.strategies.options import FedEntOptions
from fedentrpc.v1 import estimator_pb2 as est_pb

EXACT, PAPER = est_pb.FEDENT_VARIANT_EXACT, est_pb.FEDENT_VARIANT_PAPER
USED, STAR = est_pb.PHI2_RATE_USED, est_pb.PHI2_RATE_STAR


def test_unset_fields_take_the_options_defaults() -> None:
    opts = fedent_options(est_pb.FedEntParams(beta=0.9, variant=EXACT, phi2_rate=USED))
    # γ = 0 is a value, not "unset"; an unset eta_max is no cap (eta_max: null)
    assert opts == FedEntOptions(beta=0.9, gamma=0.0, eta_max=None)
    full = fedent_options(est_pb.FedEntParams(beta=0.5, gamma=0.7, variant=PAPER, eta_max=1.0, phi2_rate=STAR),
                          eps1=0.1, eps2=0.2, max_sweeps=3)
    assert full == FedEntOptions(beta=0.5, gamma=0.7, variant="paper", eps1=0.1, eps2=0.2, max_sweeps=3,
                                 eta_max=1.0, phi2_rate="star")


def test_options_survive_the_wire() -> None:
    """Every FedEnt option the solvers read goes out and comes back equal (mappers.fedent_params)."""
    from fedentrpc import mappers

    for o in (FedEntOptions(), FedEntOptions(eta_max=None, phi2_rate="star", gamma=0.5, variant="paper", beta=0.9)):
        back = fedent_options(mappers.fedent_params(o.beta, o.gamma, o.variant, o.eta_max, o.phi2_rate))
        assert back == o


@pytest.mark.parametrize(
    "params, algo1, needle",
    [
        (est_pb.FedEntParams(variant=EXACT, phi2_rate=USED), {}, "params.beta: must be in (0, 1), got 0.0"),
        (est_pb.FedEntParams(beta=0.9, gamma=1.5, variant=EXACT, phi2_rate=USED), {},
         "params.gamma: must be in [0, 1]"),
        (est_pb.FedEntParams(beta=0.9, phi2_rate=USED), {}, "params.variant: FEDENT_VARIANT_UNSPECIFIED is not "
                                                            "allowed; send one of FEDENT_VARIANT_EXACT, "
                                                            "FEDENT_VARIANT_PAPER"),
        (est_pb.FedEntParams(beta=0.9, variant=7, phi2_rate=USED), {},  # type: ignore[arg-type]
         "params.variant: value 7 is not allowed"),
        (est_pb.FedEntParams(beta=0.9, variant=EXACT), {}, "params.phi2_rate: PHI2_RATE_UNSPECIFIED is not allowed"),
        (est_pb.FedEntParams(beta=0.9, variant=EXACT, phi2_rate=USED, eta_max=0.0), {}, "params.eta_max: must be"),
        (est_pb.FedEntParams(beta=0.9, variant=EXACT, phi2_rate=USED), {"eps1": -1.0}, "request.eps1: must be > 0"),
        (est_pb.FedEntParams(beta=0.9, variant=EXACT, phi2_rate=USED), {"max_sweeps": -2},
         "request.max_sweeps: must be >= 1"),
    ],
)
def test_bad_values_are_value_errors_keyed_by_the_request_field(params: est_pb.FedEntParams, algo1: dict[str, float],
                                                                 needle: str) -> None:
    with pytest.raises(ConfigError) as e:  # a ValueError: the service answers INVALID_ARGUMENT
        fedent_options(params, **algo1)  # type: ignore[arg-type]
    assert isinstance(e.value, ValueError) and needle in str(e.value), str(e.value)
