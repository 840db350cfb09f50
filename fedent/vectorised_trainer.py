"""Many clients' local SGD in one step: ``torch.func`` over parameters stacked along a client axis.

On a GPU a small CNN at batch 32 leaves the device nearly idle; training the round's clients together
(``vmap`` of ``grad`` of a ``functional_call``) fills it. Each client still sees exactly the batches, in
the order, that ``LocalTrainer.train`` gives it (``LocalTrainer.batch_plan``), with its own rate and
gradient correction (``LocalFit``). A client with fewer batches is masked (its rate is 0 on the steps it
does not have), never given extra steps; a short last batch is padded with weight-0 samples, so its loss
is the mean over its real samples, as in the sequential trainer.

Local DP (``trainer.dp``, set by the client host): each step is DP-SGD's (``fedent.privacy.dpsgd``), the
per-sample gradients of every client in one pass (``vmap`` over clients of the per-sample ``vmap``), clipped,
and noised with a draw from each client's own generator after its batch plan, exactly as ``LocalTrainer.train``
draws it, so a vectorised local-DP run equals the sequential one.

Models with dropout, batch norm or anything else ``vmap`` cannot run are refused by ``unsupported``, and
the executor then falls back to the sequential one with that message.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, grad_and_value, vmap

from fedent.conv_forms import FORMS, swap_convs
from fedent.params import Params
from fedent.privacy.dpsgd import DPSGD, clip_and_noise_stacked, draw_noise, per_sample_grads
from fedent.trainer import LocalTrainer, TrainResult


@dataclass(frozen=True)
class ClientRun:
    """One client's share of a vectorised step: its samples, batch stream, rate and correction."""

    indices: Tensor  # the client's sample indices into the trainer's data tensors
    generator: torch.Generator  # the same stream ``LocalTrainer.train`` would draw from
    lr: float
    weight_coef: float = 0.0
    linear: Params | None = None  # on the trainer's device
    start: Params | None = None  # this client's own starting point (a stacked run's w(t)); None: the call's


@dataclass(frozen=True)
class GradientRequest:
    """One client's gradient at a common point: its samples, the batch's stream and size (None: training's)."""

    indices: Tensor
    generator: torch.Generator
    batch_size: int | None = None
    point: Params | None = None  # this request's own point (a stacked run's); None: the call's


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
    cpu = torch.device("cpu")  # built on the host and copied once: no device round trip per batch
    plans = [trainer.batch_plan(r.indices, r.generator, epochs, cpu) for r in runs]
    bs = trainer.batch_size
    s_max = max((len(p) for p in plans), default=0)
    index = torch.zeros((len(runs), s_max, bs), dtype=torch.int64)
    weight = torch.zeros((len(runs), s_max, bs), dtype=trainer.x.dtype if trainer.x.is_floating_point()
                         else torch.float32)
    for c, plan in enumerate(plans):
        for s, idx in enumerate(plan):
            n = int(idx.numel())
            index[c, s, :n] = idx
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


# A step's shape: clients in the chunk, whether they carry a w-weighted and a constant correction, local DP's
# numbers (None: plain SGD); each has its own buffers and (on CUDA) its own captured graph.
StepKey = tuple[int, bool, bool, DPSGD | None]


@dataclass
class StepState:
    """The tensors one vectorised SGD step reads and writes in place; static, so a CUDA graph can replay it."""

    params: dict[str, Tensor]  # (C, ...) per parameter
    lr: Tensor  # (C,)
    coef: Tensor | None  # (C,): the w-weight of each client's correction
    linear: dict[str, Tensor] | None  # (C, ...): each client's constant correction
    index: Tensor  # (C, B) this step's sample indices
    weight: Tensor  # (C, B) 1 for a real sample, 0 for padding
    active: Tensor  # (C,) 1 where the client really takes this step
    total: Tensor  # (C,) float32 sum of the losses of the steps taken
    noise: dict[str, Tensor] | None = None  # (C, ...) local DP: this step's standard normal draw per client

    @classmethod
    def empty(cls, trainer: LocalTrainer, names: Sequence[str], n: int, has_coef: bool,
              has_linear: bool, noised: bool = False) -> StepState:
        dev, bs = trainer.device, trainer.batch_size
        params = {name: torch.empty((n, *p.shape), dtype=p.dtype, device=dev)
                  for name, p in zip(names, trainer.params, strict=True)}
        dtype = trainer.params[0].dtype
        vec = lambda: torch.zeros(n, dtype=dtype, device=dev)  # noqa: E731
        return cls(params, vec(), vec() if has_coef else None,
                   {k: torch.zeros_like(v) for k, v in params.items()} if has_linear else None,
                   torch.zeros((n, bs), dtype=torch.int64, device=dev), torch.zeros((n, bs), dtype=dtype, device=dev),
                   vec(), torch.zeros(n, dtype=torch.float32, device=dev),
                   {k: torch.zeros_like(v) for k, v in params.items()} if noised else None)

    def load(self, start: Sequence[Tensor] | None, runs: Sequence[ClientRun], names: Sequence[str]) -> None:
        """Every client starts from its own ``start`` or else from the common ``start``, with its own rate and
        correction; the loss sums restart at 0."""
        if any(r.start is None for r in runs):
            if start is None:
                raise ValueError("a client without its own start needs the call's start")
            for name, p in zip(names, start, strict=True):
                self.params[name].copy_(p.detach().unsqueeze(0).expand_as(self.params[name]))
        for c, r in enumerate(runs):
            if r.start is not None:
                for name, p in zip(names, r.start, strict=True):
                    self.params[name][c].copy_(p.detach())
        self.lr.copy_(torch.tensor([r.lr for r in runs], dtype=self.lr.dtype))
        if self.coef is not None:
            self.coef.copy_(torch.tensor([r.weight_coef for r in runs], dtype=self.coef.dtype))
        if self.linear is not None:
            for c, r in enumerate(runs):
                for i, name in enumerate(names):
                    if r.linear is None:
                        self.linear[name][c].zero_()
                    else:
                        self.linear[name][c].copy_(r.linear[i])
        self.total.zero_()

    def snapshot(self) -> list[Tensor]:
        return [t.clone() for t in (*self.params.values(), self.total)]

    def restore(self, saved: Sequence[Tensor]) -> None:
        for t, v in zip((*self.params.values(), self.total), saved, strict=True):
            t.copy_(v)


def capture_step(step: Callable[[StepState], None], st: StepState) -> Callable[[], None] | None:
    """``step`` on ``st`` as a CUDA graph, checked once against the eager step; None (eager) if either fails.

    The capture runs on whatever ``st`` holds (the warm-up steps change it, so it is restored afterwards).
    """
    saved = st.snapshot()
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: lazy initialisation and allocator pools happen outside the capture
                step(st)
        torch.cuda.current_stream().wait_stream(side)
        st.restore(saved)
        graph = torch.cuda.CUDAGraph()
        # thread_local: stacked runs (fedent.rounds.stacking) that left the stack may still use the GPU from their
        # own threads while the stack's thread captures; their calls must not break this capture
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            step(st)
        st.restore(saved)
        step(st)
        want = st.snapshot()
        st.restore(saved)
        graph.replay()
        got = st.snapshot()
        st.restore(saved)
    except RuntimeError as e:  # capture is not supported for some op: stay eager
        st.restore(saved)
        print(f"vectorised trainer: CUDA graph capture failed ({e}); running eagerly", file=sys.stderr)
        return None
    worst = max(float((a - b).abs().max()) / (1.0 + float(a.abs().max())) for a, b in zip(want, got, strict=True))
    # a broken capture (stale inputs, a missed op) is off by O(1); under TF32 (train.precision) cuDNN may pick
    # another algorithm inside the capture, which differs by rounding at TF32's 10 mantissa bits
    if worst > (1e-3 if torch.backends.cudnn.allow_tf32 else 1e-6):
        print(f"vectorised trainer: the CUDA graph step differs from the eager one ({worst:.1e}); running eagerly",
              file=sys.stderr)
        return None
    return graph.replay


class VectorisedTrainer:
    """Trains several clients at once on ``trainer``'s model structure, data and device."""

    def __init__(self, trainer: LocalTrainer, conv: str = "direct") -> None:
        why = unsupported(trainer.model)
        if why is not None:
            raise ValueError(why)
        if conv not in ("direct", *FORMS):
            raise ValueError(f"conv must be direct, unfold or looped, got {conv!r}")
        self.trainer = trainer
        self.names = [n for n, _ in trainer.model.named_parameters()]
        self.buffers = {n: b for n, b in trainer.model.named_buffers()}
        model = trainer.model
        if conv in FORMS:
            model, swapped = swap_convs(trainer.model, FORMS[conv])
            conv = conv if swapped else "direct"  # no convolution to swap: say what really runs
        self.conv = conv

        def loss_fn(params: dict[str, Tensor], xb: Tensor, yb: Tensor, wb: Tensor) -> Tensor:
            out = functional_call(model, (params, self.buffers), (xb,))
            ce = F.cross_entropy(out, yb, reduction="none")
            return (ce * wb).sum() / wb.sum().clamp_min(1.0)

        self._step = vmap(grad_and_value(loss_fn))
        self._grad_at = vmap(grad(loss_fn), in_dims=(None, 0, 0, 0))  # many batches, one point
        self._grad_each = vmap(grad(loss_fn))  # many batches, each at its own point (stacked runs)
        # local DP: ({name: (C, B, ...)}, (C, B) losses), every client's per-sample gradients in one pass
        self._per_sample = vmap(per_sample_grads(model, self.buffers))
        self.use_graphs = os.environ.get("FEDENT_CUDA_GRAPHS", "1") != "0"
        self._states: dict[StepKey, StepState] = {}
        self._runners: dict[StepKey, Callable[[], None]] = {}

    def train(self, start: Sequence[Tensor] | None, runs: Sequence[ClientRun],
              epochs: int) -> list[tuple[Params, TrainResult]]:
        """E epochs of SGD for every client in ``runs`` from the same ``start`` (or each from its own,
        ``ClientRun.start``: stacked runs, fedent.rounds.stacking); (w_i, result) per client."""
        tr = self.trainer
        if not runs:
            return []
        tr.model.train()
        table = batch_table(tr, runs, epochs)
        has_coef = any(r.weight_coef != 0.0 for r in runs)
        has_linear = any(r.linear is not None for r in runs)
        dp = tr.dp
        noised = dp is not None and dp.noise_multiplier * dp.clip_norm > 0
        key: StepKey = (len(runs), has_coef, has_linear, dp)
        st = self._states.get(key) or self._states.setdefault(
            key, StepState.empty(tr, self.names, len(runs), has_coef, has_linear, noised))
        st.load(start, runs, self.names)
        active = table.active.to(st.lr.dtype)  # (C, S)
        was_grad = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
        try:
            run: Callable[[], None] | None = None
            for s in range(active.shape[1]):
                st.index.copy_(table.index[:, s])
                st.weight.copy_(table.weight[:, s])
                st.active.copy_(active[:, s])
                if st.noise is not None:
                    self._draw_noise(st, runs, [k > s for k in table.steps])
                run = run or self._runner(key, st)  # after step 0's inputs are in place: a capture uses them
                run()
        finally:
            torch.set_grad_enabled(was_grad)
        losses = st.total.cpu().tolist()
        out: list[tuple[Params, TrainResult]] = []
        for c, k in enumerate(table.steps):
            params = [st.params[n][c].clone() for n in self.names]
            out.append((params, TrainResult(loss=losses[c] / max(k, 1), steps=k)))
        return out

    def gradients(self, point: Sequence[Tensor] | None, requests: Sequence[GradientRequest]) -> list[Params]:
        """∇F_i at ``point`` (or at each request's own ``point``: stacked runs) for each request, each on one
        random batch drawn exactly as ``LocalTrainer.gradient`` draws it (FedEnt's probe), all in one vmapped
        pass."""
        tr = self.trainer
        if not requests:
            return []
        picks = []
        for r in requests:
            n = int(r.indices.numel())
            bs = min(r.batch_size or tr.batch_size, n)
            picks.append(r.indices[torch.randperm(n, generator=r.generator)[:bs]])
        width = max(int(p.numel()) for p in picks)
        index = torch.zeros((len(picks), width), dtype=torch.int64)
        weight = torch.zeros((len(picks), width), dtype=tr.params[0].dtype)
        for c, p in enumerate(picks):
            index[c, : p.numel()] = p
            weight[c, : p.numel()] = 1.0
        index, weight = index.to(tr.device), weight.to(tr.device)
        tr.model.train()
        own = [r.point for r in requests]
        if all(p is None for p in own):
            if point is None:
                raise ValueError("a request without its own point needs the call's point")
            params = {n: p.detach().to(tr.device) for n, p in zip(self.names, point, strict=True)}
            with torch.no_grad():
                grads = self._grad_at(params, tr.x[index], tr.y[index], weight)
        else:
            points = [p if p is not None else point for p in own]
            if any(p is None for p in points):
                raise ValueError("a request without its own point needs the call's point")
            each = {n: torch.stack([p[i].detach().to(tr.device) for p in points if p is not None])
                    for i, n in enumerate(self.names)}
            with torch.no_grad():
                grads = self._grad_each(each, tr.x[index], tr.y[index], weight)
        return [[grads[n][c] for n in self.names] for c in range(len(picks))]

    def _draw_noise(self, st: StepState, runs: Sequence[ClientRun], takes: Sequence[bool]) -> None:
        """This step's DP-SGD noise: for each client that takes the step, one ``draw_noise`` from its own
        generator (the draw ``LocalTrainer.train`` makes at the same step); zeros for a masked client, which
        draws nothing, as the sequential trainer takes no such step."""
        assert st.noise is not None
        shapes = [p.shape for p in self.trainer.params]
        dtype = self.trainer.params[0].dtype
        draws = [draw_noise(shapes, dtype, r.generator) if t else [torch.zeros(s, dtype=dtype) for s in shapes]
                 for r, t in zip(runs, takes, strict=True)]
        for i, n in enumerate(self.names):
            st.noise[n].copy_(torch.stack([d[i] for d in draws]))

    def _gradients(self, st: StepState) -> tuple[dict[str, Tensor], Tensor]:
        """Every client's step gradient and loss: the batch mean's, or under local DP Eq. (DP4)'s clipped and
        noised per-sample mean (the loss then the mean of the real samples' losses, as the sequential one)."""
        x, y = self.trainer.x, self.trainer.y
        dp = self.trainer.dp
        if dp is None:
            grads, loss = self._step(st.params, x[st.index], y[st.index], st.weight)
            return grads, loss
        per, losses = self._per_sample(st.params, x[st.index], y[st.index])
        noise = None if st.noise is None else [st.noise[n] for n in self.names]
        out = clip_and_noise_stacked([per[n] for n in self.names], st.weight, noise, dp)
        loss = (losses * st.weight).sum(1) / st.weight.sum(1).clamp_min(1.0)
        return dict(zip(self.names, out, strict=True)), loss

    def _sgd_step(self, st: StepState) -> None:
        """One step for every client, in place: w ← w − η·(∇ + coef·w + linear) where active, else w unchanged;
        loss summed where active."""
        grads, loss = self._gradients(st)
        rate = st.lr * st.active
        takes = st.active > 0
        for n in self.names:
            p, g = st.params[n], grads[n]
            shape = (p.shape[0],) + (1,) * (p.dim() - 1)
            if st.coef is not None:
                g = g + st.coef.view(shape) * p
            if st.linear is not None:
                g = g + st.linear[n]
            # a masked client's step is exactly none: its padded batch's gradient is never applied, even where it
            # is not finite (0 · NaN is NaN); stacked runs pad every client to the longest client of any run
            p.sub_(torch.where(takes.view(shape), rate.view(shape) * g, 0.0))
        st.total.add_(torch.where(takes, loss.float(), 0.0))

    def _runner(self, key: StepKey, st: StepState) -> Callable[[], None]:
        """How to run one step on ``st``: a replayed CUDA graph on a GPU (the step is launch-bound: one graph
        replaces hundreds of kernel launches), else the eager step. Captured on first use, with real inputs, and
        kept per chunk shape, so later rounds reuse the graph of the first."""
        if key not in self._runners:
            eager: Callable[[], None] = lambda: self._sgd_step(st)  # noqa: E731
            graphed = capture_step(self._sgd_step, st) if self.trainer.device.type == "cuda" and self.use_graphs \
                else None
            if graphed is not None:
                print(f"vectorised trainer: step captured as a CUDA graph for {key[0]} clients", file=sys.stderr)
            self._runners[key] = graphed or eager
        return self._runners[key]
