"""ε(δ) of a run so far, from dp-accounting's RDP accountant, for the sampling the run really does.

Central DP (client level). Every round the engine samples m = round(fraction·N) of the N clients uniformly
without replacement (``fedent.rng.sample_clients``) and releases the clipped sum plus Gaussian noise of std
z·C. Neighbouring runs replace one client's data (N and m are public and fixed), so the sum's L2 sensitivity is
2C and the event of one round is ``SampledWithoutReplacementDpEvent(N, m, GaussianDpEvent(z/2))`` under
``NeighboringRelation.REPLACE_ONE`` (dp-accounting's noise multiplier is std / sensitivity); k released rounds
compose to ``SelfComposedDpEvent(that, k)``. A round that missed its quorum released nothing and costs nothing.

Local DP (sample level, DP-SGD on each client). Client i takes E·⌈n_i/B⌉ steps per round it joins, each on a
batch of B of its n_i samples, clipped per sample to C, with noise z·C on the sum. The batches are a shuffled
partition of each epoch, for which no tight accountant exists; we account each step as Poisson sampling with
q = B/n_i (``PoissonSampledDpEvent(q, GaussianDpEvent(z))``, add/remove-one), as Opacus and TF Privacy do for
shuffled batches: an approximation, stated in docs/security.md. The run's ε is the largest over its clients.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import attr
import dp_accounting
import numpy as np
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS, compute_epsilon

ACCOUNTANT = "rdp"
REPLACE_ONE = dp_accounting.NeighboringRelation.REPLACE_ONE
ADD_OR_REMOVE_ONE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


def event_json(event: dp_event.DpEvent) -> dict[str, Any]:
    """A DpEvent as plain JSON: ``{"type": <class name>, <its fields>}``, nested events alike."""
    out: dict[str, Any] = {"type": type(event).__name__}
    for f in attr.fields(type(event)):
        v = getattr(event, f.name)
        out[f.name] = event_json(v) if isinstance(v, dp_event.DpEvent) else v
    return out


def central_round_event(num_clients: int, sample_size: int, noise_multiplier: float) -> dp_event.DpEvent:
    """One central-DP round: m of N without replacement, then the Gaussian sum (sensitivity 2C, std z·C)."""
    gaussian = dp_event.GaussianDpEvent(noise_multiplier / 2.0)
    if sample_size >= num_clients:  # everyone, every round: no amplification by sampling
        return gaussian
    return dp_event.SampledWithoutReplacementDpEvent(num_clients, sample_size, gaussian)


def local_step_event(num_samples: int, batch_size: int, noise_multiplier: float) -> dp_event.DpEvent:
    """One DP-SGD step of a client with ``num_samples`` samples (accounted as Poisson sampling, q = B/n)."""
    q = min(1.0, batch_size / max(num_samples, 1))
    gaussian = dp_event.GaussianDpEvent(noise_multiplier)
    return gaussian if q >= 1.0 else dp_event.PoissonSampledDpEvent(q, gaussian)


def steps_per_round(num_samples: int, batch_size: int, epochs: int) -> int:
    """DP-SGD steps a client takes in one round (``LocalTrainer.batch_plan``: E epochs of ⌈n/B⌉ batches)."""
    return epochs * max(1, math.ceil(num_samples / batch_size))


@functools.lru_cache(maxsize=4096)
def _rdp_of_one(event: dp_event.DpEvent, relation: dp_accounting.NeighboringRelation) -> tuple[float, ...]:
    """The RDP curve (at ``RdpAccountant``'s default orders) of one ``event``. dp-accounting computes a
    k-fold ``SelfComposedDpEvent`` as exactly k times this curve, so caching it makes a round's ε cost
    microseconds instead of the ~1 s the sampled-without-replacement curve takes to compute."""
    acc = RdpAccountant(neighboring_relation=relation)
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)  # "failed to converge ... excluding this order": dp-accounting drops that order
    try:  # (a larger, safe ε), once per curve; the warning would repeat in every worker's log
        acc.compose(event)
    finally:
        absl.setLevel(level)
    return tuple(float(v) for v in acc._rdp)  # the accountant's curve; no public getter in dp-accounting 0.6


def epsilon(event: dp_event.DpEvent, count: int, relation: dp_accounting.NeighboringRelation,
            delta: float) -> float:
    """ε(δ) of ``SelfComposedDpEvent(event, count)``, as ``RdpAccountant.get_epsilon`` gives it."""
    if count <= 0:
        return 0.0
    rdp = np.asarray(_rdp_of_one(event, relation)) * count
    return float(compute_epsilon(np.asarray(DEFAULT_RDP_ORDERS), rdp, float(delta))[0])


def central_report(num_clients: int, sample_size: int, noise_multiplier: float, released: int,
                   delta: float) -> dict[str, Any]:
    """The ``privacy`` entry of a central-DP run after ``released`` rounds that released an aggregate."""
    if noise_multiplier <= 0:
        return {"epsilon": math.inf, "delta": delta, "accountant": ACCOUNTANT, "event": None}
    one = central_round_event(num_clients, sample_size, noise_multiplier)
    event = dp_event.SelfComposedDpEvent(one, released)
    return {"epsilon": epsilon(one, released, REPLACE_ONE, delta), "delta": delta, "accountant": ACCOUNTANT,
            "relation": "replace_one", "event": event_json(event)}


def local_report(sizes: Sequence[int], participations: Mapping[int, int], batch_size: int, epochs: int,
                 noise_multiplier: float, delta: float) -> dict[str, Any]:
    """The ``privacy`` entry of a local-DP run: the largest ε over the clients that trained (``participations``:
    client -> rounds it trained in that released an aggregate), with that client's event."""
    worst: tuple[float, int, dp_event.DpEvent | None] = (0.0, -1, None)
    for cid, rounds in sorted(participations.items()):
        if rounds <= 0:
            continue
        n = int(sizes[cid])
        if noise_multiplier <= 0:
            return {"epsilon": math.inf, "delta": delta, "accountant": ACCOUNTANT, "event": None, "client": cid}
        one, steps = local_step_event(n, batch_size, noise_multiplier), rounds * steps_per_round(n, batch_size, epochs)
        eps = epsilon(one, steps, ADD_OR_REMOVE_ONE, delta)
        event = dp_event.SelfComposedDpEvent(one, steps)
        if eps > worst[0]:
            worst = (eps, cid, event)
    eps, cid, event = worst
    return {"epsilon": eps, "delta": delta, "accountant": ACCOUNTANT, "relation": "add_or_remove_one",
            "event": None if event is None else event_json(event), "client": None if cid < 0 else cid}
