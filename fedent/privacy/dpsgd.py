"""Local DP: DP-SGD's gradient (Abadi et al. 2016) for ``LocalTrainer.train``, per-sample via ``torch.func``.

For a batch of B samples: each sample's gradient g_j (``vmap`` of ``grad`` of a ``functional_call``: one
pass, no per-sample loop), clipped to L2 norm C over all parameters (factor min(1, C/(‖g_j‖ + 1e-6)), as
Opacus clips), summed, Gaussian noise of std z·C added, divided by B (the batch's real size: batches are a
fixed-size partition of each epoch, the last one may be short). The noise is drawn on the CPU from the
client's own training generator after its batch plan, so a worker and the simulator add the same noise.

A strategy's gradient correction (FedProx's proximal term, SCAFFOLD's and FedDyn's) is added after the noise:
it depends on w and on state that is itself post-processing of earlier noised steps. Models whose per-sample
gradients are not defined (batch norm couples the samples of a batch) are refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

CLIP_EPS = 1e-6  # Opacus's stabiliser in the per-sample clip factor


@dataclass(frozen=True)
class DPSGD:
    """DP-SGD's two numbers; the per-client steps are ``LocalTrainer.train``'s."""

    clip_norm: float
    noise_multiplier: float


def refuse(model: nn.Module) -> str | None:
    """Why per-sample gradients of ``model`` are not DP-SGD's, or None."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            return "the model has batch norm, which mixes the samples of a batch: per-sample clipping bounds nothing"
    return None


class PerSampleGrads:
    """Per-sample gradients of the cross-entropy of ``model`` (one vmapped pass)."""

    def __init__(self, model: nn.Module) -> None:
        why = refuse(model)
        if why is not None:
            raise ValueError(f"local DP (DP-SGD): {why}")
        self.model = model
        self.names = [n for n, _ in model.named_parameters()]
        self.buffers = dict(model.named_buffers())

        def loss_one(params: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
            out = functional_call(model, (params, self.buffers), (x.unsqueeze(0),))
            return F.cross_entropy(out, y.unsqueeze(0))

        # dropout draws per sample ("different"), from torch's global RNG that LocalTrainer seeds per client
        self._per_sample = vmap(grad_and_value(loss_one), in_dims=(None, 0, 0), randomness="different")

    def __call__(self, params: Sequence[Tensor], x: Tensor, y: Tensor) -> tuple[list[Tensor], Tensor]:
        """([B, *p.shape] per parameter, the B losses)."""
        named = {n: p.detach() for n, p in zip(self.names, params, strict=True)}
        grads, losses = self._per_sample(named, x, y)
        return [grads[n] for n in self.names], losses


def clip_and_noise(per_sample: Sequence[Tensor], dp: DPSGD, generator: torch.Generator) -> list[Tensor]:
    """(Σ_j g_j·min(1, C/(‖g_j‖+1e-6)) + N(0, (zC)²)) / B, per parameter."""
    b = per_sample[0].shape[0]
    # per-sample norms and the weighted sum as reductions and one matrix-vector product each: no (B × params)
    # temporaries (an elementwise square and an einsum cost as much as the per-sample gradients themselves)
    norms = torch.stack([torch.linalg.vector_norm(g.reshape(b, -1), dim=1) for g in per_sample], 1)
    factor = (dp.clip_norm / (torch.linalg.vector_norm(norms, dim=1) + CLIP_EPS)).clamp(max=1.0)
    out = []
    std = dp.noise_multiplier * dp.clip_norm
    for g in per_sample:
        summed = (factor.to(g.dtype) @ g.reshape(b, -1)).reshape(g.shape[1:])
        if std > 0:
            summed = summed + std * torch.randn(summed.shape, generator=generator, dtype=summed.dtype).to(
                summed.device)
        out.append(summed / b)
    return out
