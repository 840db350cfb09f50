"""Local training on a reused model object and on data tensors that stay on the device.

The simulator and the cluster worker both train through this class. There is no DataLoader and no
per-batch Python beyond the step itself: batches are index gathers from tensors already on the device,
the SGD step is one foreach kernel, and the loss is summed on the device and read once per call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedent.params import Params, copy_into
from fedent.privacy.dpsgd import DPSGD, PerSampleGrads, clip_and_noise
from fedent.rng import GLOBAL_RNG

# A hook that may modify the gradients in place before each SGD step: (params, grads) -> None.
GradHook = Callable[[Sequence[Tensor], Sequence[Tensor]], None]


@dataclass(frozen=True)
class TrainResult:
    loss: float  # mean training loss over the steps taken
    steps: int


def _pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_device(name: str) -> torch.device:
    """auto -> cuda when present, else cpu; an unavailable cuda request is an error, not a crash later."""
    dev = _pick_device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available; use --device cpu")
    return dev


def set_precision(device: torch.device, precision: str) -> None:
    """float32 means float32 on CUDA: cuDNN's TF32 convolutions (on by default) round inputs to 10 mantissa bits,
    so two executors, or a worker and the simulator, would drift apart by ~1e-4 within a round. ``tf32``
    (train.precision) opts into tensor cores for speed. The flags are per process: the last trainer built sets
    them (one run per process in the simulator, the worker and reproduce)."""
    if device.type == "cuda":
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"


class LocalTrainer:
    """One model object reused for every client; the whole train set lives on ``device`` as tensors."""

    def __init__(self, model: nn.Module, x: Tensor, y: Tensor, batch_size: int, device: torch.device,
                 precision: str = "float32") -> None:
        self.device = device
        set_precision(device, precision)
        self.model = model.to(device)
        self.x = x.to(device)
        self.y = y.to(device)
        self.batch_size = int(batch_size)
        self.params: Params = list(self.model.parameters())
        # Dropout draws from torch's global RNG; it is re-seeded from the client's generator per call
        # so that a worker process and the simulator draw identical masks.
        self._stochastic = any(isinstance(m, nn.Dropout) and m.p > 0 for m in self.model.modules())
        self.dp: DPSGD | None = None  # local DP: ``train`` runs DP-SGD (set by the client host, from the config)
        self._per_sample: PerSampleGrads | None = None

    def use_dp(self, dp: DPSGD | None) -> None:
        """Train with DP-SGD (``dp``) or plain SGD (None) from now on; a model DP-SGD cannot train is refused."""
        if dp is not None and self._per_sample is None:
            self._per_sample = PerSampleGrads(self.model)
        self.dp = dp

    def load(self, params: Sequence[Tensor]) -> None:
        """Copy a global model into the reused model in place."""
        copy_into(self.params, params)

    def batch_plan(self, indices: Tensor, generator: torch.Generator, epochs: int,
                   device: torch.device | None = None) -> list[Tensor]:
        """Every minibatch of an E-epoch local run, in order: one fresh permutation per epoch, split into
        batches of ``batch_size`` (the last one of each epoch may be short). Both executors train on exactly
        this sequence, so they agree client by client. On ``device`` (default the trainer's)."""
        dev = self.device if device is None else device
        out: list[Tensor] = []
        for _ in range(epochs):
            perm = torch.randperm(indices.numel(), generator=generator)
            out.extend(torch.split(indices[perm].to(dev, non_blocking=True), self.batch_size))
        return out

    def train(
        self,
        indices: Tensor,
        lr: float,
        epochs: int,
        generator: torch.Generator,
        grad_hook: GradHook | None = None,
    ) -> TrainResult:
        """E epochs of minibatch SGD with a fixed rate on the client's samples ``indices`` (DP-SGD's clipped and
        noised gradient when ``use_dp`` set one; its noise drawn from ``generator`` after the batch plan)."""
        with self._rng_turn():
            return self._train(indices, lr, epochs, generator, grad_hook)

    def _rng_turn(self) -> AbstractContextManager[Any]:
        """A model with dropout draws its masks from torch's process-wide generator: runs in threads of one
        process (stacked runs, fedent.rounds.stacking, that trained alone) take turns, so each client's draws
        follow its own seed as in a run alone. A model without dropout draws nothing and never waits."""
        return GLOBAL_RNG if self._stochastic else contextlib.nullcontext()

    def _train(self, indices: Tensor, lr: float, epochs: int, generator: torch.Generator,
               grad_hook: GradHook | None) -> TrainResult:
        model, params = self.model, self.params
        model.train()
        if self._stochastic:
            torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
        total = torch.zeros((), device=self.device)
        steps = 0
        dp, per_sample = self.dp, self._per_sample
        for idx in self.batch_plan(indices, generator, epochs):
            if dp is not None and per_sample is not None:
                sample_grads, losses = per_sample(params, self.x[idx], self.y[idx])
                grads, loss = clip_and_noise(sample_grads, dp, generator), losses.mean()
            else:
                out = model(self.x[idx])
                loss = F.cross_entropy(out, self.y[idx])
                grads = list(torch.autograd.grad(loss, params))
            if grad_hook is not None:
                grad_hook(params, grads)
            with torch.no_grad():
                torch._foreach_add_(params, grads, alpha=-lr)
            total += loss.detach()
            steps += 1
        return TrainResult(loss=float(total) / max(steps, 1), steps=steps)

    def gradient(self, indices: Tensor, generator: torch.Generator, batch_size: int | None = None) -> Params:
        """∇F_i at the current parameters on one random batch (FedEnt's probe, Algorithm 2 line 4)."""
        bs = min(batch_size or self.batch_size, indices.numel())
        pick = torch.randperm(indices.numel(), generator=generator)[:bs]
        idx = indices[pick].to(self.device)
        self.model.train()
        with self._rng_turn():
            loss = F.cross_entropy(self.model(self.x[idx]), self.y[idx])
            return [g.detach() for g in torch.autograd.grad(loss, self.params)]

    @torch.no_grad()
    def evaluate(self, x: Tensor, y: Tensor, batch_size: int = 1000) -> tuple[float, float]:
        """(mean loss, accuracy) of the current parameters on (x, y)."""
        self.model.eval()
        loss_sum = torch.zeros((), device=self.device, dtype=torch.float64)
        correct = torch.zeros((), device=self.device, dtype=torch.int64)
        n = int(y.shape[0])
        for s in range(0, n, batch_size):
            xb = x[s : s + batch_size].to(self.device, non_blocking=True)
            yb = y[s : s + batch_size].to(self.device, non_blocking=True)
            out = self.model(xb)
            loss_sum += F.cross_entropy(out, yb, reduction="sum").double()
            correct += (out.argmax(1) == yb).sum()
        return float(loss_sum) / max(n, 1), int(correct) / max(n, 1)
