"""FedEnt's options from an estimator request, validated by the class the config uses (FedEntOptions).

The service keeps no defaults or range checks of its own for FedEnt's knobs: a request's ``FedEntParams``
(and StartOffline's eps1, eps2, max_sweeps) become a ``FedEntOptions``, whose errors are ValueErrors
(the service answers INVALID_ARGUMENT) keyed by the request field.
"""

from __future__ import annotations

from typing import Any

from fedent.config import OptionError
from fedent.strategies.options import FedEntOptions
from fedentrpc import mappers
from fedentrpc.codec import WireError
from fedentrpc.v1 import estimator_pb2 as est_pb

# FedEntParams fields; the Algorithm 1 knobs are StartOffline fields
_IN_PARAMS = ("beta", "gamma", "variant", "eta_max", "phi2_rate")


def fedent_options(params: est_pb.FedEntParams, *, eps1: float = 0.0, eps2: float = 0.0,
                   max_sweeps: int = 0) -> FedEntOptions:
    """proto3 zero (unset) ``eps1``, ``eps2``, ``max_sweeps`` take FedEntOptions' defaults; ``variant`` is
    required (FEDENT_VARIANT_UNSPECIFIED is reported, like any enum value outside the table), and so is
    ``phi2_rate``; an unset ``eta_max`` is FedEntOptions' ``eta_max: null`` (no cap).

    ``beta`` and ``gamma`` are taken as sent: β = 0 is out of range and reported, γ = 0 is a valid value.
    """
    try:
        variant = mappers.variant_from_msg(params.variant)
    except WireError as e:
        raise OptionError("params", "variant", str(e).split(": ", 1)[1]) from None
    try:
        phi2_rate = mappers.phi2_rate_from_msg(params.phi2_rate)
    except WireError as e:
        raise OptionError("params", "phi2_rate", str(e).split(": ", 1)[1]) from None
    sent = {"variant": variant, "eps1": eps1, "eps2": eps2, "max_sweeps": max_sweeps}
    raw: dict[str, Any] = {"beta": params.beta, "gamma": params.gamma, "phi2_rate": phi2_rate,
                           "eta_max": params.eta_max if params.HasField("eta_max") else None,
                           **{k: v for k, v in sent.items() if v}}
    try:
        return FedEntOptions(**raw)
    except OptionError as e:
        raise OptionError("params" if e.field in _IN_PARAMS else "request", e.field, e.why) from None
