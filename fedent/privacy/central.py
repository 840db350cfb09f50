"""Central (client-level) DP at the aggregator: DP-FedAvg's clip, sum, noise and mean, before any strategy.

Each accepted upload's difference from w(t), together with any extra tensor groups it carries (SCAFFOLD's
Δc_i), is one vector u_i; it is clipped to L2 norm C, the clipped vectors are summed, Gaussian noise of std
z·C is added to the sum and the result divided by the round's fixed sample size m (uniform weights: sample
counts would make one client's weight, and so the sensitivity, data-dependent). Every update handed on to the
strategy then carries that one noised mean (w(t) + ū, and ū's extra groups): whatever the strategy does with
its updates (FedAvg's sample weights, FedAdam's server optimiser, FedDyn's Σλ, SCAFFOLD's Σ Δc_i, a robust
rule's median) is computed from the DP release only, so the reported ε covers the global model for every
strategy. The aggregator itself is trusted: it sees the raw uploads, as central DP assumes.

Noise is drawn on the CPU from ``fedent.rng.torch_generator(seed, "dp", round)``, in parameter order, so the
simulator and the cluster (both aggregate in ``RoundEngine``) add the same noise.

Adaptive clipping (Andrew et al. 2021, "Differentially private learning with adaptive clipping"): the count
of unclipped updates gets Gaussian noise of std σ_b, b̄ = noised count / m, and C ← C·exp(−η_C(b̄ − γ)). The
updates' noise multiplier becomes z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2), so the two releases together cost what one
Gaussian release with multiplier z costs (what the accountant charges).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from fedent.config import ConfigError, PrivacyConfig
from fedent.rng import torch_generator
from fedent.strategies.base import ClientUpdate


def update_noise_multiplier(z: float, count_stddev: float) -> float:
    """z_Δ of Andrew et al. (Theorem 1): the updates' multiplier that, with the count's noise σ_b, costs z."""
    if z == 0:
        return 0.0
    rest = z ** -2 - (2.0 * count_stddev) ** -2
    if rest <= 0:
        raise ConfigError(f"privacy.clipped_count_stddev: must exceed noise_multiplier / 2 = {z / 2:g} "
                          f"(got {count_stddev:g}): the count's noise alone would spend the whole budget")
    return rest ** -0.5


@dataclass(frozen=True)
class Released:
    """One round's release: the updates the strategy sees, and what the round logs about it."""

    updates: list[ClientUpdate]
    info: dict[str, Any]


class CentralDP:
    """The per-round mechanism; stateless besides the config (the adaptive clip norm comes in as an argument,
    kept by ``RunPrivacy`` in metrics.jsonl so a resumed run continues with it)."""

    def __init__(self, cfg: PrivacyConfig, seed: int, sample_size: int) -> None:
        self.cfg, self.seed, self.sample_size = cfg, int(seed), int(sample_size)
        # the paper's default m/20 suits its hundreds of clients a round; for a few it would leave the updates no
        # budget (z_Δ needs 2σ_b > z), so it is raised to z there: the updates' noise grows by at most 15%
        self.count_stddev = (cfg.clipped_count_stddev if cfg.clipped_count_stddev is not None
                             else max(self.sample_size / 20.0, cfg.noise_multiplier))
        self.z_updates = (update_noise_multiplier(cfg.noise_multiplier, self.count_stddev) if cfg.adaptive_clip
                          else cfg.noise_multiplier)

    def release(self, rnd: int, global_params: Sequence[Tensor], updates: Sequence[ClientUpdate],
                clip: float) -> Released:
        """Clip each update to ``clip``, noise the sum, divide by m; every returned update carries that mean."""
        if not updates:
            raise ValueError("central DP: no updates to release")
        groups = sorted({k for u in updates for k in u.tensors})
        w = [p.detach() for p in global_params]
        total: list[Tensor] | None = None
        unclipped = 0
        norms: list[float] = []
        for u in updates:
            vec = [p.detach().to(q.device) - q for p, q in zip(u.params, w, strict=True)]
            for k in groups:
                vec.extend(t.detach().to(q.device) for t, q in zip(u.tensors.get(k) or [torch.zeros_like(q)
                                                                                         for q in w], w, strict=True))
            norm = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(vec))))  # one pass, no copies
            norms.append(norm)
            unclipped += norm <= clip
            scale = min(1.0, clip / norm) if norm > 0 else 1.0
            if total is None:
                total = [v * scale for v in vec]
            else:
                torch._foreach_add_(total, vec, alpha=scale)
        assert total is not None
        gen = torch_generator(self.seed, "dp", rnd)
        std = self.z_updates * clip
        for t in total:
            t.add_(torch.randn(t.shape, generator=gen, dtype=t.dtype).to(t.device), alpha=std)
            t.div_(self.sample_size)
        info: dict[str, Any] = {"clip_norm": clip, "noise_std": std, "clipped": len(updates) - unclipped,
                                "mean_update_norm": sum(norms) / len(norms)}
        if self.cfg.adaptive_clip:
            noised = unclipped + self.count_stddev * float(torch.randn((), generator=gen, dtype=torch.float64))
            frac = noised / self.sample_size
            info["unclipped_fraction"] = frac
            info["next_clip_norm"] = clip * math.exp(-self.cfg.clip_learning_rate * (frac - self.cfg.target_quantile))
        n = len(w)
        new_params = [q + d for q, d in zip(w, total[:n], strict=True)]
        extras = {k: total[n * (i + 1): n * (i + 2)] for i, k in enumerate(groups)}
        out = [replace(u, params=[t.clone() for t in new_params],
                       tensors={k: [t.clone() for t in v] for k, v in extras.items()}) for u in updates]
        return Released(out, info)
