"""DP-SGD on the client: per-sample gradients by torch.func, clipped and noised, checked against Opacus."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedent.privacy.dpsgd import DPSGD, PerSampleGrads, clip_and_noise
from fedent.trainer import LocalTrainer

B = 16


def _model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 5))


def _data(n: int = B) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return torch.randn(n, 1, 6, 6, generator=g) * 2, torch.randint(0, 5, (n,), generator=g)


def _one_step(model: nn.Module, dp: DPSGD | None, lr: float = 0.5, seed: int = 0) -> list[torch.Tensor]:
    x, y = _data()
    tr = LocalTrainer(copy.deepcopy(model), x, y, batch_size=B, device=torch.device("cpu"))
    tr.use_dp(dp)
    tr.train(torch.arange(B), lr, 1, torch.Generator().manual_seed(seed))
    return [p.detach().clone() for p in tr.params]


def test_per_sample_gradients_equal_a_loop_of_single_sample_backward_passes() -> None:
    model = _model()
    x, y = _data()
    grads, losses = PerSampleGrads(model)(list(model.parameters()), x, y)
    for j in range(B):
        loss = F.cross_entropy(model(x[j:j + 1]), y[j:j + 1])
        want = torch.autograd.grad(loss, list(model.parameters()))
        assert losses[j] == pytest.approx(float(loss.detach()), rel=1e-5)
        for g, w in zip(grads, want, strict=True):
            assert torch.allclose(g[j], w, atol=1e-6)


def test_a_dp_sgd_step_equals_opacus_with_the_same_clip() -> None:
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    model, clip, lr = _model(), 0.3, 0.5
    x, y = _data()
    ref = GradSampleModule(copy.deepcopy(model))
    opt = DPOptimizer(torch.optim.SGD(ref.parameters(), lr=lr), noise_multiplier=0.0, max_grad_norm=clip,
                      expected_batch_size=B)
    opt.zero_grad()
    F.cross_entropy(ref(x), y).backward()
    opt.step()
    ours = _one_step(model, DPSGD(clip, 0.0), lr)
    for a, b in zip(ours, ref.parameters(), strict=True):
        assert torch.allclose(a, b.detach(), atol=1e-6)
    plain = _one_step(model, None, lr)  # the clip is active: plain SGD lands elsewhere
    assert max(float((a - b).abs().max()) for a, b in zip(ours, plain, strict=True)) > 1e-2


def test_the_noise_has_std_z_c_over_b_and_comes_from_the_clients_generator() -> None:
    model, clip, z, lr = _model(), 0.3, 1.5, 0.5
    clean = _one_step(model, DPSGD(clip, 0.0), lr)
    noisy = _one_step(model, DPSGD(clip, z), lr)
    diff = torch.cat([(a - b).flatten() for a, b in zip(noisy, clean, strict=True)]) / -lr
    assert float(diff.std()) == pytest.approx(z * clip / B, rel=0.1)  # (ΣCLIP + N(0,(zC)²)) / B
    assert all(torch.equal(a, b) for a, b in zip(noisy, _one_step(model, DPSGD(clip, z), lr), strict=True))
    other = _one_step(model, DPSGD(clip, z), lr, seed=1)
    assert not all(torch.equal(a, b) for a, b in zip(noisy, other, strict=True))


def test_clip_and_noise_scales_each_sample_to_at_most_c() -> None:
    g = [torch.tensor([[3.0, 4.0], [0.3, 0.4]])]  # norms 5 and 0.5
    out = clip_and_noise(g, DPSGD(1.0, 0.0), torch.Generator())
    assert torch.allclose(out[0], (torch.tensor([0.6, 0.8]) * 5 / (5 + 1e-6) + torch.tensor([0.3, 0.4])) / 2)


def test_batch_norm_models_are_refused() -> None:
    x, y = _data()
    tr = LocalTrainer(nn.Sequential(nn.Flatten(), nn.Linear(36, 4), nn.BatchNorm1d(4)), x, y, B, torch.device("cpu"))
    with pytest.raises(ValueError, match="batch norm"):
        tr.use_dp(DPSGD(1.0, 1.0))
