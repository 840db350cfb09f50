"""The speed levers of ``train.perf`` (issue 28), applied to the simulator's trainer and host once, at build.

Each lever is off by default and changes how the same training is computed, not what is trained:
``cudnn_benchmark`` lets cuDNN time its convolution algorithms (a CUDA process flag); ``channels_last`` stores
the model's weights and the image tensors NHWC; ``autocast: bf16`` runs every forward pass (sequential,
vectorised, evaluation) under bfloat16 autocast while the weights, gradients and updates stay float32 (the
master weights); ``compile`` hands the vectorised executor's vmapped step to ``torch.compile``;
``eval_batched`` scores every client's local test split in one batched pass (one forward over the union of
the splits, then per-client sums by index) instead of one pass per client. tests/fedent/test_perf.py holds
each against the default on the CPU with its tolerance; the speed is measured on the GPU
(tools/device_check.sh, benchmarks/profile_step.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedent.config import PerfOptions
from fedent.rounds.evaluation import ClientEval, FederatedEval, test_shards
from fedent.trainer import LocalTrainer

# the names apply_trainer and apply_host report, and eval_batched (applied where the simulator builds its evaluator)
LEVERS = ("cudnn_benchmark", "channels_last", "autocast_bf16", "compile", "eval_batched")


def levers_named(names: Sequence[str]) -> PerfOptions:
    """``train.perf`` with the named levers on (the names ``apply_trainer`` and ``apply_host`` report, for the
    benchmarks' ``--perf``); an unknown name is a ``ValueError`` naming the known ones."""
    chosen = {n.strip() for n in names if n.strip() and n.strip() != "none"}
    if unknown := sorted(chosen - set(LEVERS)):
        raise ValueError(f"unknown lever {', '.join(unknown)}; known: {', '.join(LEVERS)}")
    return PerfOptions(cudnn_benchmark="cudnn_benchmark" in chosen, channels_last="channels_last" in chosen,
                       autocast="bf16" if "autocast_bf16" in chosen else "off", compile="compile" in chosen,
                       eval_batched="eval_batched" in chosen)


def autocast_forward(model: nn.Module, device_type: str) -> None:
    """``model``'s forward under bfloat16 autocast, its output back in float32 (losses and argmax in float32);
    the parameters are untouched, so SGD updates float32 master weights. Set on the instance, so
    ``functional_call`` (the vectorised step) runs it too."""
    inner = model.forward

    @functools.wraps(inner)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=device_type, dtype=torch.bfloat16):
            out = inner(*args, **kwargs)
        return out.float() if isinstance(out, Tensor) else out

    # a copy of the model (the vectorised trainer's unfold/looped convolutions) would share this closure and run
    # the original's modules, untrained by functional_call: it wraps its own forward again through this
    forward.rebind = lambda copy: autocast_forward(copy, device_type)  # type: ignore[attr-defined]
    model.forward = forward  # type: ignore[method-assign]


def apply_trainer(perf: PerfOptions, trainer: LocalTrainer) -> list[str]:
    """The levers that live on the trainer (its model and data); returns the names of those applied."""
    applied = []
    if perf.cudnn_benchmark:
        torch.backends.cudnn.benchmark = True
        applied.append("cudnn_benchmark")
    if perf.channels_last and trainer.x.dim() == 4:
        trainer.model.to(memory_format=torch.channels_last)
        trainer.x = trainer.x.contiguous(memory_format=torch.channels_last)
        trainer.params = list(trainer.model.parameters())
        applied.append("channels_last")
    if perf.autocast == "bf16":
        autocast_forward(trainer.model, trainer.device.type)
        applied.append("autocast_bf16")
    return applied


def apply_host(perf: PerfOptions, host: Any) -> list[str]:
    """The levers that live on the host: ``compile`` of the vectorised step (a sequential host has none)."""
    vt = getattr(host, "vtrainer", None)
    vt = getattr(vt, "own", vt)  # a stacked run's own trainer (fedent.rounds.stacking): the step the stack runs
    if perf.compile and vt is not None:
        vt._step = torch.compile(vt._step, dynamic=False)
        vt.use_graphs = False  # the compiled step is not captured again as a CUDA graph
        return ["compile"]
    return []


def evaluate_batched(trainer: LocalTrainer, x: Tensor, y: Tensor, shards: dict[int, np.ndarray], cids: Sequence[int],
                     params: Sequence[Tensor], batch_size: int) -> dict[int, ClientEval]:
    """``evaluate_shards`` in one pass: the union of the named clients' splits forward in batches of
    ``batch_size``, each sample's loss and hit summed into its client (``index_add_``) on the device."""
    trainer.load(params)
    trainer.model.eval()
    parts = [(c, np.asarray(shards.get(c, ()), dtype=np.int64)) for c in cids]
    owner = torch.from_numpy(np.concatenate([np.full(len(ix), k, dtype=np.int64) for k, (_, ix) in enumerate(parts)]
                                            or [np.zeros(0, np.int64)])).to(x.device)
    index = torch.from_numpy(np.concatenate([ix for _, ix in parts] or [np.zeros(0, np.int64)])).to(x.device)
    loss = torch.zeros(len(parts), dtype=torch.float64, device=x.device)
    hits = torch.zeros(len(parts), dtype=torch.int64, device=x.device)
    with torch.no_grad():
        for s in range(0, int(index.numel()), batch_size):
            sel, who = index[s:s + batch_size], owner[s:s + batch_size]
            out = trainer.model(x[sel])
            loss.index_add_(0, who, F.cross_entropy(out, y[sel], reduction="none").double())
            hits.index_add_(0, who, (out.argmax(1) == y[sel]).long())
    sums, correct = loss.cpu().tolist(), hits.cpu().tolist()
    return {c: ClientEval(c, len(ix), sums[k] / len(ix) if len(ix) else 0.0, correct[k] / len(ix) if len(ix) else 0.0)
            for k, (c, ix) in enumerate(parts)}


def batched_federated(trainer: LocalTrainer, x_test: Tensor, y_test: Tensor, num_clients: int, seed: int,
                      batch_size: int) -> FederatedEval:
    """``central_federated`` with ``evaluate_batched``: the same splits, one pass."""
    from fedent.rounds.executor import Gathered

    shards = dict(enumerate(test_shards(int(y_test.shape[0]), num_clients, seed)))
    x, y = x_test.to(trainer.device), y_test.to(trainer.device)
    if trainer.x.dim() == 4 and trainer.x.is_contiguous(memory_format=torch.channels_last):
        x = x.contiguous(memory_format=torch.channels_last)

    def run(rnd: int, params: Sequence[Tensor]) -> Gathered[ClientEval]:
        return Gathered(evaluate_batched(trainer, x, y, shards, range(num_clients), params, batch_size))

    return run


