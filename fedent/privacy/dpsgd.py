"""Local DP: DP-SGD's gradient (Abadi et al. 2016) for ``LocalTrainer.train``, per-sample via ``torch.func``.

For a batch of B samples: each sample's gradient g_j (``vmap`` of ``grad`` of a ``functional_call``: one
pass, no per-sample loop), clipped to L2 norm C over all parameters (factor min(1, C/(‖g_j‖ + 1e-6)), as
Opacus clips), summed, Gaussian noise of std z·C added, divided by B (the batch's real size: batches are a
fixed-size partition of each epoch, the last one may be short). The noise is drawn on the CPU from the
client's own training generator after its batch plan, so a worker and the simulator add the same noise.

Both executors run this arithmetic: the sequential host one client at a time (``LocalTrainer.train``), the
vectorised host a stack of clients in one step (``fedent.vectorised_trainer``: ``vmap`` over clients of the
per-sample ``vmap``, padded samples weighted 0, each client's noise drawn from its own generator in the same
order), so the two give the same models.

A strategy's gradient correction (FedProx's proximal term, SCAFFOLD's and FedDyn's) is added after the noise:
it depends on w and on state that is itself post-processing of earlier noised steps. Models whose per-sample
gradients are not defined (batch norm couples the samples of a batch) are refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


def per_sample_grads(model: nn.Module, buffers: dict[str, Tensor], randomness: str = "error"
                     ) -> Callable[[dict[str, Tensor], Tensor, Tensor], tuple[dict[str, Tensor], Tensor]]:
    """(params, x (B, ...), y (B,)) -> ({name: (B, *p.shape)}, the B losses): ``vmap`` over the samples of
    ``grad_and_value`` of one sample's cross-entropy through ``functional_call``. The vectorised trainer
    ``vmap``s this once more, over clients."""

    def loss_one(params: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        out = functional_call(model, (params, buffers), (x.unsqueeze(0),))
        return F.cross_entropy(out, y.unsqueeze(0))

    return vmap(grad_and_value(loss_one), in_dims=(None, 0, 0), randomness=randomness)  # type: ignore[no-any-return]


class PerSampleGrads:
    """Per-sample gradients of the cross-entropy of ``model`` (one vmapped pass)."""

    def __init__(self, model: nn.Module) -> None:
        why = refuse(model)
        if why is not None:
            raise ValueError(f"local DP (DP-SGD): {why}")
        self.model = model
        self.names = [n for n, _ in model.named_parameters()]
        self.buffers = dict(model.named_buffers())
        # dropout draws per sample ("different"), from torch's global RNG that LocalTrainer seeds per client
        self._per_sample = per_sample_grads(model, self.buffers, randomness="different")

    def __call__(self, params: Sequence[Tensor], x: Tensor, y: Tensor) -> tuple[list[Tensor], Tensor]:
        """([B, *p.shape] per parameter, the B losses)."""
        named = {n: p.detach() for n, p in zip(self.names, params, strict=True)}
        grads, losses = self._per_sample(named, x, y)
        return [grads[n] for n in self.names], losses


def draw_noise(shapes: Sequence[torch.Size], dtype: torch.dtype, generator: torch.Generator) -> list[Tensor]:
    """One step's ξ: a standard normal tensor per parameter, in parameter order, on the CPU from ``generator``
    (both executors draw a client's noise through this, so their streams agree step by step)."""
    return [torch.randn(s, generator=generator, dtype=dtype) for s in shapes]


def clip_and_noise_stacked(per_sample: Sequence[Tensor], weight: Tensor, noise: Sequence[Tensor] | None,
                           dp: DPSGD) -> list[Tensor]:
    """Eq. (DP4) for C clients at once: per_sample (C, B, *p.shape) per parameter, weight (C, B) 1 for a real
    sample and 0 for padding, noise (C, *p.shape) standard normal (None: z = 0). Returns
    (Σ_j w_j·g_j·min(1, C/(‖g_j‖+1e-6)) + zC·ξ) / Σ_j w_j per client and parameter (a client without a real
    sample divides by 1: its step is masked by the caller)."""
    c, b = weight.shape
    # per-sample norms and the weighted sum as reductions and one batched matrix-vector product each: no
    # (C × B × params) temporaries (an elementwise square and an einsum cost as much as the gradients themselves)
    norms = torch.stack([torch.linalg.vector_norm(g.reshape(c, b, -1), dim=2) for g in per_sample], 2)
    factor = (dp.clip_norm / (torch.linalg.vector_norm(norms, dim=2) + CLIP_EPS)).clamp(max=1.0) * weight
    count = weight.sum(1).clamp_min(1.0)
    std = dp.noise_multiplier * dp.clip_norm
    out = []
    for k, g in enumerate(per_sample):
        summed = torch.bmm(factor.to(g.dtype).unsqueeze(1), g.reshape(c, b, -1)).reshape(c, *g.shape[2:])
        if std > 0 and noise is not None:
            summed = summed + std * noise[k]
        out.append(summed / count.to(g.dtype).view((c,) + (1,) * (g.dim() - 2)))
    return out


def clip_and_noise(per_sample: Sequence[Tensor], dp: DPSGD, generator: torch.Generator) -> list[Tensor]:
    """(Σ_j g_j·min(1, C/(‖g_j‖+1e-6)) + N(0, (zC)²)) / B, per parameter: one client's batch (B, *p.shape), its
    noise drawn from ``generator`` (``clip_and_noise_stacked`` with one client and no padding)."""
    b = per_sample[0].shape[0]
    g0 = per_sample[0]
    noise = None
    if dp.noise_multiplier * dp.clip_norm > 0:
        noise = [z.to(g0.device).unsqueeze(0)
                 for z in draw_noise([g.shape[1:] for g in per_sample], g0.dtype, generator)]
    weight = torch.ones((1, b), dtype=g0.dtype, device=g0.device)
    return [t[0] for t in clip_and_noise_stacked([g.unsqueeze(0) for g in per_sample], weight, noise, dp)]
