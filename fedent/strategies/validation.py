"""Checks of a client's probe and update against its strategy's ``PayloadSpec``, before anyone accepts them.

The aggregator calls these on every upload; a violation raises ``StrategyError`` with a one-line reason, and
the client is excluded from the round instead of failing the run later (a probe without ``a`` in FedEnt's
``round_payload``) or poisoning server state (a NaN in SCAFFOLD's Δc reaching the server's c).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from torch import Tensor

from fedent.params import all_finite, num_elements
from fedent.strategies.base import ClientUpdate, PayloadSpec, Probe, Strategy, StrategyError


def _check_names(got: Iterable[str], want: Sequence[str], kind: str, what: str) -> None:
    """Exactly the declared names: none missing, none unknown."""
    missing, unknown = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    parts = ([f"lacks {kind} {missing}"] if missing else []) + ([f"has unknown {kind} {unknown}"] if unknown else [])
    if parts:
        raise StrategyError(f"{what} {' and '.join(parts)}")


def _check_scalars(got: Mapping[str, float], want: Sequence[str], what: str, spec: PayloadSpec | None = None) -> None:
    _check_names(got, want, "scalars", what)
    bad = sorted(k for k, v in got.items() if not math.isfinite(float(v)))
    if bad:
        raise StrategyError(f"{what} has non-finite scalars {bad}")
    for k in sorted(got):
        bounds = spec.range_of(k) if spec is not None else None
        if bounds is not None and not bounds[0] <= float(got[k]) <= bounds[1]:
            raise StrategyError(f"{what}: scalar {k}={float(got[k]):g} is outside its range "
                                f"[{bounds[0]:g}, {bounds[1]:g}]")


def _check_model_shaped(got: Sequence[Tensor], like: Sequence[Tensor], what: str) -> None:
    if len(got) != len(like):
        raise StrategyError(f"{what}: {len(got)} tensors, expected {len(like)}")
    for i, (g, ref) in enumerate(zip(got, like, strict=True)):
        if g.shape != ref.shape or g.dtype != ref.dtype:
            raise StrategyError(f"{what}: tensor {i} is {g.dtype} {tuple(g.shape)}, "
                                f"expected {ref.dtype} {tuple(ref.shape)}")
    if not all_finite(got):
        raise StrategyError(f"{what} is not finite (NaN/inf)")


def _check_masked(strategy: Strategy, update: ClientUpdate, global_params: Sequence[Tensor], what: str) -> None:
    """A masked upload (secure aggregation): no clear model or groups, one uint64 ring vector as long as the model
    and the strategy's groups together. Its values cannot be checked: the client checked them before masking."""
    if update.params or update.tensors:
        raise StrategyError(f"{what}: a masked update must not carry a clear model or tensor groups")
    m = update.masked
    want = num_elements(global_params) * (1 + len(strategy.payload_spec.update_tensors))
    if not isinstance(m, np.ndarray) or m.dtype != np.uint64 or m.ndim != 1 or m.size != want:
        got = f"{m.dtype} {m.shape}" if isinstance(m, np.ndarray) else type(m).__name__
        raise StrategyError(f"{what}: the masked vector is {got}, expected uint64 ({want},)")


def check_probe(strategy: Strategy, probe: Probe, expected_samples: int | None = None) -> None:
    """``probe`` carries exactly the strategy's probe scalars, all finite (and, if given, the client's sample count)."""
    what = f"probe of client {probe.cid}"
    if not strategy.capabilities.probe:
        raise StrategyError(f"{what}: {strategy.name} has no probe step")
    if expected_samples is not None and probe.num_samples != expected_samples:
        raise StrategyError(f"{what} claims {probe.num_samples} samples, expected {expected_samples}")
    _check_scalars(probe.scalars, strategy.payload_spec.probe_scalars, what, strategy.payload_spec)


def check_update(strategy: Strategy, update: ClientUpdate, global_params: Sequence[Tensor],
                 expected_samples: int | None = None) -> None:
    """``update`` is what the strategy's ``fit`` sends: the model's shapes and dtypes, finite parameters and
    ``train_loss``, exactly the declared scalars (finite) and tensor groups (model-shaped, finite)."""
    what = f"update of client {update.cid}"
    if update.masked is not None:
        _check_masked(strategy, update, global_params, what)
    else:
        _check_model_shaped(update.params, global_params, what)
    if expected_samples is not None and update.num_samples != expected_samples:
        raise StrategyError(f"{what} claims {update.num_samples} samples, expected {expected_samples}")
    if not math.isfinite(float(update.train_loss)):
        raise StrategyError(f"{what} has a non-finite train_loss ({update.train_loss})")
    spec = strategy.payload_spec
    _check_scalars(update.scalars, spec.update_scalars, what, spec)
    if update.masked is not None:
        return
    _check_names(update.tensors, spec.update_tensors, "tensor groups", what)
    for name in spec.update_tensors:
        _check_model_shaped(update.tensors[name], global_params, f"{what}: tensor group {name!r}")
