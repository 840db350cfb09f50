"""Many clients' local SGD in one step: ``torch.func`` over parameters stacked along a client axis.

On a GPU a small CNN at batch 32 leaves the device nearly idle; training the round's clients together
(``vmap`` of ``grad`` of a ``functional_call``) fills it. Each client still sees exactly the batches, in
the order, that ``LocalTrainer.train`` gives it (``LocalTrainer.batch_plan``), with its own rate and
gradient correction (``LocalFit``). A client with fewer batches is masked (its rate is 0 on the steps it
does not have), never given extra steps; a short last batch is padded with weight-0 samples, so its loss
is the mean over its real samples, as in the sequential trainer.

Models with dropout, batch norm or anything else ``vmap`` cannot run are refused by ``unsupported``, and
the executor then falls back to the sequential one with that message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from fedent.params import Params
from fedent.trainer import LocalTrainer, TrainResult


@dataclass(frozen=True)
class ClientRun:
    """One client's share of a vectorised step: its samples, batch stream, rate and correction."""

    indices: Tensor  # the client's sample indices into the trainer's data tensors
    generator: torch.Generator  # the same stream ``LocalTrainer.train`` would draw from
    lr: float
    weight_coef: float = 0.0
    linear: Params | None = None  # on the trainer's device


@dataclass(frozen=True)
class BatchTable:
    """Every client's batches for the whole local run, padded into one (clients, steps, batch) index table."""

    index: Tensor  # int64 (C, S, B): sample indices; padding points at sample 0
    weight: Tensor  # float (C, S, B): 1 for a real sample, 0 for padding
    steps: list[int]  # the steps each client really takes

    @property
    def active(self) -> Tensor:
        """(C, S) bool: which (client, step) pairs are real steps."""
        return self.weight.sum(-1) > 0


def batch_table(trainer: LocalTrainer, runs: Sequence[ClientRun], epochs: int) -> BatchTable:
    """Draw each client's batch plan (consuming its generator as ``LocalTrainer.train`` would) and pad."""
    plans = [trainer.batch_plan(r.indices, r.generator, epochs) for r in runs]
    bs = trainer.batch_size
    s_max = max((len(p) for p in plans), default=0)
    index = torch.zeros((len(runs), s_max, bs), dtype=torch.int64)
    weight = torch.zeros((len(runs), s_max, bs), dtype=trainer.x.dtype if trainer.x.is_floating_point()
                         else torch.float32)
    for c, plan in enumerate(plans):
        for s, idx in enumerate(plan):
            n = int(idx.numel())
            index[c, s, :n] = idx.cpu()
            weight[c, s, :n] = 1.0
    dev = trainer.device
    return BatchTable(index.to(dev), weight.to(dev), [len(p) for p in plans])


def unsupported(model: nn.Module) -> str | None:
    """Why ``vmap`` cannot train this model faithfully, or None when it can."""
    for m in model.modules():
        if isinstance(m, nn.Dropout) and m.p > 0:
            return (f"the model has dropout (p={m.p}); per-client dropout masks cannot match the sequential "
                    "executor's")
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            return "the model has batch norm, whose running statistics vmap cannot update per client"
    return None


class VectorisedTrainer:
    """Trains several clients at once on ``trainer``'s model structure, data and device."""

    def __init__(self, trainer: LocalTrainer) -> None:
        why = unsupported(trainer.model)
        if why is not None:
            raise ValueError(why)
        self.trainer = trainer
        self.names = [n for n, _ in trainer.model.named_parameters()]
        self.buffers = {n: b for n, b in trainer.model.named_buffers()}
        model = trainer.model

        def loss_fn(params: dict[str, Tensor], xb: Tensor, yb: Tensor, wb: Tensor) -> Tensor:
            out = functional_call(model, (params, self.buffers), (xb,))
            ce = F.cross_entropy(out, yb, reduction="none")
            return (ce * wb).sum() / wb.sum().clamp_min(1.0)

        self._step = vmap(grad_and_value(loss_fn))

    def train(self, start: Sequence[Tensor], runs: Sequence[ClientRun],
              epochs: int) -> list[tuple[Params, TrainResult]]:
        """E epochs of SGD for every client in ``runs`` from the same ``start``; (w_i, result) per client."""
        tr = self.trainer
        if not runs:
            return []
        tr.model.train()
        table = batch_table(tr, runs, epochs)
        n_clients = len(runs)
        stacked = {n: p.detach().to(tr.device).unsqueeze(0).repeat(n_clients, *([1] * p.dim()))
                   for n, p in zip(self.names, start, strict=True)}
        dtype = next(iter(stacked.values())).dtype
        lr = torch.tensor([r.lr for r in runs], dtype=dtype, device=tr.device)
        coef = torch.tensor([r.weight_coef for r in runs], dtype=dtype, device=tr.device)
        use_coef = any(r.weight_coef != 0.0 for r in runs)
        linear = self._stack_linear(runs, stacked) if any(r.linear is not None for r in runs) else None
        active = table.active.to(dtype)  # (C, S)
        total = torch.zeros(n_clients, dtype=torch.float32, device=tr.device)
        was_grad = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
        try:
            for s in range(active.shape[1]):
                idx = table.index[:, s]
                grads, loss = self._step(stacked, tr.x[idx], tr.y[idx], table.weight[:, s])
                rate = lr * active[:, s]
                for n in self.names:
                    p, g = stacked[n], grads[n]
                    shape = (n_clients,) + (1,) * (p.dim() - 1)
                    if use_coef:
                        g = g + coef.view(shape) * p
                    if linear is not None:
                        g = g + linear[n]
                    stacked[n] = p - rate.view(shape) * g
                total += loss.float() * active[:, s]
        finally:
            torch.set_grad_enabled(was_grad)
        losses = total.cpu().tolist()
        out: list[tuple[Params, TrainResult]] = []
        for c in range(n_clients):
            k = table.steps[c]
            out.append(([stacked[n][c].clone() for n in self.names], TrainResult(loss=losses[c] / max(k, 1), steps=k)))
        return out

    def _stack_linear(self, runs: Sequence[ClientRun], like: dict[str, Tensor]) -> dict[str, Tensor]:
        """Each client's constant correction stacked along the client axis (zeros for clients without one)."""
        out = {n: torch.zeros_like(t) for n, t in like.items()}
        for c, r in enumerate(runs):
            if r.linear is None:
                continue
            for n, t in zip(self.names, r.linear, strict=True):
                out[n][c] = t
        return out
