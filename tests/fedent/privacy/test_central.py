"""Central DP's release: clipped updates, noise of std z·C on the sum, divided by m, seeded by (seed, round)."""

from __future__ import annotations

import math

import pytest
import torch

from fedent.config import ConfigError, PrivacyConfig
from fedent.privacy.central import CentralDP, update_noise_multiplier
from fedent.strategies.base import ClientUpdate

W = [torch.zeros(3), torch.zeros(2, 2)]


def _update(cid: int, scale: float, extra: bool = False) -> ClientUpdate:
    params = [torch.full((3,), scale), torch.full((2, 2), scale)]  # norm: scale·√7
    tensors = {"delta_c": [torch.full((3,), 1.0), torch.zeros(2, 2)]} if extra else {}
    return ClientUpdate(cid, params, num_samples=10 * (cid + 1), train_loss=0.1, tensors=tensors)


def test_clipping_without_noise_is_the_uniform_mean_of_the_clipped_updates() -> None:
    dp = CentralDP(PrivacyConfig(dp="central", noise_multiplier=0.0, clip_norm=1.0), seed=0, sample_size=2)
    small, big = _update(0, 0.1), _update(1, 4.0)  # norms 0.26 (kept) and 10.6 (scaled to 1)
    out = dp.release(3, W, [small, big], clip=1.0)
    want = (0.1 + 4.0 / (4.0 * math.sqrt(7))) / 2  # (u0 + u1·C/‖u1‖) / m, every coordinate alike
    for u in out.updates:  # every update carries the one release, whatever the sample counts say
        assert torch.allclose(u.params[0], torch.full((3,), want), atol=1e-7)
        assert torch.allclose(u.params[1], torch.full((2, 2), want), atol=1e-7)
    assert [u.num_samples for u in out.updates] == [10, 20]
    assert out.info["clipped"] == 1 and out.info["noise_std"] == 0.0


def test_noise_has_std_z_c_on_the_sum_and_is_seeded_by_seed_and_round() -> None:
    cfg = PrivacyConfig(dp="central", noise_multiplier=2.0, clip_norm=0.5)
    w = [torch.zeros(20000)]
    ups = [ClientUpdate(c, [torch.zeros(20000)], 5, 0.0) for c in range(4)]
    dp = CentralDP(cfg, seed=7, sample_size=4)
    a = dp.release(1, w, ups, clip=0.5).updates[0].params[0]
    assert float(a.std()) == pytest.approx(2.0 * 0.5 / 4, rel=0.03)  # (zC) on the sum, / m
    assert torch.equal(a, CentralDP(cfg, seed=7, sample_size=4).release(1, w, ups, clip=0.5).updates[0].params[0])
    assert not torch.equal(a, dp.release(2, w, ups, clip=0.5).updates[0].params[0])
    assert not torch.equal(a, CentralDP(cfg, seed=8, sample_size=4).release(1, w, ups, clip=0.5).updates[0].params[0])


def test_extra_tensor_groups_are_clipped_jointly_with_the_model_delta() -> None:
    dp = CentralDP(PrivacyConfig(dp="central", noise_multiplier=0.0), seed=0, sample_size=1)
    u = _update(0, 1.0, extra=True)  # ‖(Δw, Δc)‖² = 7 + 3 = 10
    out = dp.release(0, W, [u], clip=1.0).updates[0]
    s = 1.0 / math.sqrt(10)
    assert torch.allclose(out.params[0], torch.full((3,), s)) and torch.allclose(out.tensors["delta_c"][0],
                                                                               torch.full((3,), s))


def test_adaptive_clipping_moves_the_norm_toward_the_target_quantile() -> None:
    cfg = PrivacyConfig(dp="central", noise_multiplier=1e-9, adaptive_clip=True, target_quantile=0.5,
                        clip_learning_rate=0.2, clipped_count_stddev=1e-9)  # next to no noise: b̄ is exact
    dp = CentralDP(cfg, seed=0, sample_size=4)
    ups = [_update(c, 1.0) for c in range(4)]  # every norm √7 > 1: all clipped, b̄ = 0
    info = dp.release(0, W, ups, clip=1.0).info
    assert info["unclipped_fraction"] == pytest.approx(0.0, abs=1e-6)
    assert info["next_clip_norm"] == pytest.approx(math.exp(0.2 * 0.5))  # grows: C·exp(−η(0 − γ))
    info = dp.release(0, W, ups, clip=10.0).info  # none clipped: shrinks
    assert info["next_clip_norm"] == pytest.approx(10.0 * math.exp(-0.2 * 0.5))


def test_adaptive_clipping_pays_for_the_count_out_of_the_updates_noise() -> None:
    assert update_noise_multiplier(1.0, 5.0) == pytest.approx((1.0 - 1 / 100) ** -0.5)
    dp = CentralDP(PrivacyConfig(dp="central", noise_multiplier=1.0, adaptive_clip=True), seed=0, sample_size=40)
    assert dp.count_stddev == 2.0 and dp.z_updates == pytest.approx((1 - 1 / 16) ** -0.5)  # σ_b = m/20
    few = CentralDP(PrivacyConfig(dp="central", noise_multiplier=1.0, adaptive_clip=True), seed=0, sample_size=5)
    assert few.count_stddev == 1.0  # m/20 = 0.25 would leave the updates no budget: raised to z
    with pytest.raises(ConfigError, match="clipped_count_stddev"):
        update_noise_multiplier(2.0, 1.0)
