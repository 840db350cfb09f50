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
- ``alie`` ("A Little Is Enough", Baruch et al. 2019): the attackers collude; each trains honestly, then every one
  of them uploads w(t) + μ − z·σ, μ and σ the coordinate-wise mean and standard deviation of the coalition's honest
  deltas and z = ``adversary.z`` or the paper's z_max (``alie_z``); a shift inside the honest spread, which
  coordinate-wise rules and Krum do not single out;
- ``inflate-count``: report ``inflated_count`` samples (at Ready, and in every upload) and upload zeros.

ALIE's coalition is the attackers one host trains in one fit call (``ClientHost`` holds their honest updates back
until the call's last fit): in the simulator, whose one host trains every client, that is every attacker of the
round; in the cluster it is those on the same worker, since workers never see each other's updates. A cluster
whose attackers all sit on one worker therefore uploads what the simulator does (tests/server/test_remote.py);
spread over several workers, each worker's attackers form their own, smaller coalition (docs/security.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

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


def alie_z(n: int, m: int) -> float:
    """Baruch et al.'s z_max for m attackers among n clients: with s = ⌊n/2 + 1⌋ − m, the honest "supporters" the
    attackers need for a majority, z_max = max{z : Φ(z) < (n − s)/n} = Φ⁻¹((n − s)/n): about s honest values lie
    farther from the mean than μ − z·σ, so a majority-based rule still finds the attackers central. 0 when
    (n − s)/n <= 1/2; s is at least 1 (an attacker majority gets Φ⁻¹((n − 1)/n))."""
    if n <= 0 or m <= 0:
        return 0.0
    s = max(1, math.floor(n / 2 + 1) - m)
    p = (n - s) / n
    return NormalDist().inv_cdf(p) if p > 0.5 else 0.0


@dataclass(frozen=True)
class Adversary:
    """One run's attack: which clients, what they do (``AdversaryConfig``)."""

    cfg: AdversaryConfig
    clients: frozenset[int]
    seed: int
    num_clients: int = 0  # N, for ALIE's z_max

    @classmethod
    def from_config(cls, cfg: AdversaryConfig, seed: int, num_clients: int) -> Adversary | None:
        """None when there is no attack (``attack: none`` or nobody chosen)."""
        if cfg.attack == "none":
            return None
        chosen = attackers(seed, num_clients, cfg.fraction)
        return cls(cfg, frozenset(chosen), seed, num_clients) if chosen else None

    def attacks(self, cid: int) -> bool:
        return cid in self.clients

    @property
    def colludes(self) -> bool:
        """The attackers' uploads depend on each other's honest updates (ALIE): the host holds them back."""
        return self.cfg.attack == "alie"

    @property
    def z(self) -> float:
        """ALIE's shift in standard deviations: ``adversary.z``, or z_max for the federation's N clients and
        round(fraction · N) attackers (the same in every world; a round's expected proportions are these)."""
        return float(self.cfg.z) if self.cfg.z is not None else alie_z(self.num_clients, len(self.clients))

    def collude(self, honest: Sequence[ClientUpdate], global_params: Sequence[Tensor]) -> list[ClientUpdate]:
        """ALIE: every coalition member's upload becomes w(t) + μ − z·σ, μ and σ the coordinate-wise mean and
        standard deviation (Bessel-corrected; 0 for a coalition of one) of the members' honest deltas, taken in
        cid order so every world sums alike; each keeps its own count, scalars and tensor groups."""
        if not honest:
            return []
        members = sorted(honest, key=lambda u: u.cid)
        w = [p.detach().to(q.device, q.dtype) for p, q in zip(global_params, members[0].params, strict=True)]
        z, k = self.z, len(members)
        forged = []
        for j, wj in enumerate(w):
            deltas = torch.stack([u.params[j].detach().to(wj.device, wj.dtype) - wj for u in members])
            sigma = deltas.std(dim=0, correction=1) if k > 1 else torch.zeros_like(wj)
            forged.append(wj + (deltas.mean(dim=0) - z * sigma))
        by_cid = {u.cid: dataclasses.replace(u, params=[f.clone() for f in forged]) for u in members}
        return [by_cid[u.cid] for u in honest]

    def reported_samples(self, cid: int, honest: int) -> int:
        """The sample count client ``cid`` reports (its honest count unless it inflates)."""
        return self.cfg.inflated_count if self.attacks(cid) and self.cfg.attack == "inflate-count" else honest

    def tamper(self, rnd: int, update: ClientUpdate, global_params: Sequence[Tensor]) -> ClientUpdate:
        """The upload of client ``update.cid`` after its honest fit: unchanged for honest clients and for
        label-flip (whose poison is in the data); the strategy's own scalars and tensor groups are kept."""
        a = self.cfg.attack
        if not self.attacks(update.cid) or a in ("label-flip", "alie"):  # alie: ``collude``, over the coalition
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
