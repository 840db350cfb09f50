"""Simulated attackers in the client half (``adversary:`` in the config; docs/security.md).

Why here: the attack is applied by the ``ClientHost`` that hosts the attacking clients, the same code in the
simulator and on every worker, so a cluster under attack gives the simulator's models (its workers hosting the
attackers attack) and every defence is tested against the uploads it would see over the wire.

The attackers are ``round(fraction · N)`` clients drawn from (train.seed, "adversary"), the same set everywhere.
Every attack is finite and well-formed, so the acceptance rule lets it through; only the robust rules and the
bounded trust of fedent.rounds.robust stand between it and the model:

- ``sign-flip``: upload w(t) − Δ_i (Δ_i = w_i − w(t), the honest delta);
- ``scale``: upload w(t) + scale · Δ_i (−10 by default: a scaled sign flip);
- ``gaussian``: upload w(t) + ε, ε ~ N(0, noise_std²) per coordinate, seeded by (seed, round, client);
- ``label-flip``: train honestly on poisoned data, label y replaced by C − 1 − y (data poisoning);
- ``inflate-count``: report ``inflated_count`` samples (at Ready, and in every upload) and upload zeros.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from fedent.config import AdversaryConfig
from fedent.rng import numpy_rng, torch_generator
from fedent.strategies.base import ClientUpdate


def attackers(seed: int, num_clients: int, fraction: float) -> list[int]:
    """The attacking clients: ``round(fraction · num_clients)`` of them, drawn from (seed, "adversary")."""
    k = min(num_clients, int(round(fraction * num_clients)))
    if k <= 0:
        return []
    return sorted(int(c) for c in numpy_rng(seed, "adversary").choice(num_clients, size=k, replace=False))


@dataclass(frozen=True)
class Adversary:
    """One run's attack: which clients, what they do (``AdversaryConfig``)."""

    cfg: AdversaryConfig
    clients: frozenset[int]
    seed: int

    @classmethod
    def from_config(cls, cfg: AdversaryConfig, seed: int, num_clients: int) -> Adversary | None:
        """None when there is no attack (``attack: none`` or nobody chosen)."""
        if cfg.attack == "none":
            return None
        chosen = attackers(seed, num_clients, cfg.fraction)
        return cls(cfg, frozenset(chosen), seed) if chosen else None

    def attacks(self, cid: int) -> bool:
        return cid in self.clients

    def reported_samples(self, cid: int, honest: int) -> int:
        """The sample count client ``cid`` reports (its honest count unless it inflates)."""
        return self.cfg.inflated_count if self.attacks(cid) and self.cfg.attack == "inflate-count" else honest

    def tamper(self, rnd: int, update: ClientUpdate, global_params: Sequence[Tensor]) -> ClientUpdate:
        """The upload of client ``update.cid`` after its honest fit: unchanged for honest clients and for
        label-flip (whose poison is in the data); the strategy's own scalars and tensor groups are kept."""
        a = self.cfg.attack
        if not self.attacks(update.cid) or a == "label-flip":
            return update
        w = [p.detach().to(q.device, q.dtype) for p, q in zip(global_params, update.params, strict=True)]
        if a == "inflate-count":
            return dataclasses.replace(update, params=[torch.zeros_like(p) for p in update.params],
                                       num_samples=self.cfg.inflated_count)
        if a == "gaussian":
            gen = torch_generator(self.seed, "adversary", rnd, update.cid)
            params = [wi + self.cfg.noise_std * torch.randn(wi.shape, generator=gen, dtype=wi.dtype).to(wi.device)
                      for wi in w]
            return dataclasses.replace(update, params=params)
        factor = -1.0 if a == "sign-flip" else self.cfg.scale
        params = [wi + factor * (p - wi) for wi, p in zip(w, update.params, strict=True)]
        return dataclasses.replace(update, params=params)

    def poison_labels(self, y: Tensor, indices: Mapping[int, Tensor], num_classes: int) -> None:
        """label-flip: y ← C − 1 − y in place at the hosted attackers' sample indices (the clients' indices are
        disjoint, so honest clients' labels are untouched)."""
        if self.cfg.attack != "label-flip":
            return
        for cid, ix in indices.items():
            if self.attacks(cid):
                sel = ix.to(y.device)
                y[sel] = (num_classes - 1) - y[sel]
