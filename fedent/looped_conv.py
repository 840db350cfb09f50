"""A convolution whose ``vmap`` over clients loops over the clients instead of grouping them (``train.conv: looped``).

Under ``vmap`` over clients, ``F.conv2d`` with per-client weights becomes one grouped convolution (a group per
client). On an H100 cuDNN runs that with a generic implicit-GEMM kernel (conv2's forward and data gradient took
54% of the vectorised step, benchmarks/README.md "Issue 28 on one H100"), and MNIST-CNN's first layer, one input
channel per client, falls to ATen's depthwise kernels. Here each client's forward, data gradient and weight
gradient is an ordinary convolution on its own batch, the shape cuDNN's tuned (tensor-core) kernels are made for;
inside the vectorised trainer's CUDA graph the extra launches cost nothing on the host, and on side streams
(``STREAMS``) the clients' convolutions can run side by side. Not yet measured on a GPU (benchmarks/README.md).

The batching rules are ``torch.autograd.Function.vmap`` staticmethods, so ``vmap(grad(...))`` and local DP's
per-sample ``vmap`` nest through them: a level where only the input is batched (one weight for every sample or
batch) merges that level into the convolution's batch; a level where the weight is batched loops. The result is
the same function as ``F.conv2d`` (tests/fedent/test_looped_conv.py holds it, and its gradients, to 1e-5).
Second derivatives are not provided: nothing in the trainer takes them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

Geometry = tuple[tuple[int, int], tuple[int, int], tuple[int, int]]  # stride, padding, dilation
T = TypeVar("T")

# CUDA streams a loop spreads its clients over (1: one after the other). One client's convolution at batch 32
# fills a fraction of a large GPU's multiprocessors; on side streams that fork from the current stream and join
# back to it, a CUDA graph captures the clients as parallel branches. The benchmarks set it; nothing else does.
STREAMS = 4
_side_streams: dict[torch.device, list[Any]] = {}


def _each(n: int, fn: Callable[[int], T], like: Tensor) -> list[T]:
    """``[fn(0), ..., fn(n - 1)]``; on CUDA, round-robin over ``STREAMS`` side streams. Every fork waits for the
    current stream and the current stream waits for every side stream before anything reads the results, so a
    block freed on either side is never reused while the other still reads it (no ``record_stream`` needed)."""
    if not like.is_cuda or STREAMS < 2 or n < 2:
        return [fn(i) for i in range(n)]
    main = torch.cuda.current_stream(like.device)
    side = _side_streams.setdefault(like.device, [torch.cuda.Stream(like.device) for _ in range(STREAMS)])
    k = min(len(side), n)
    for st in side[:k]:
        st.wait_stream(main)
    out: list[T] = []
    for i in range(n):
        with torch.cuda.stream(side[i % k]):
            out.append(fn(i))
    for st in side[:k]:
        main.wait_stream(st)
    return out


def _to_front(t: Tensor | None, dim: int | None, n: int) -> Tensor | None:
    """``t`` with its batch dimension first, expanded to ``n`` where it has none (None stays None)."""
    if t is None:
        return None
    if dim is None:
        return t.unsqueeze(0).expand(n, *t.shape)
    return t.movedim(dim, 0)


class _Conv(torch.autograd.Function):
    """``F.conv2d(x, w, b)`` with a looping batching rule and a backward that loops the same way."""

    @staticmethod
    def forward(x: Tensor, w: Tensor, b: Tensor | None, geom: Geometry) -> Tensor:  # type: ignore[override]
        stride, padding, dilation = geom
        return F.conv2d(x, w, b, stride, padding, dilation)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        x, w, b, geom = inputs
        ctx.save_for_backward(x, w)
        ctx.geom = geom
        ctx.has_bias = b is not None

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, w = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        gx, gw = _ConvBackward.apply(grad_out, x, w, ctx.geom, (bool(need_x), bool(need_w)))
        gb = grad_out.sum((0, 2, 3)) if ctx.has_bias and need_b else None
        return (gx if need_x else None), (gw if need_w else None), gb, None

    @staticmethod
    def vmap(info: Any, in_dims: tuple[Any, ...], x: Tensor, w: Tensor, b: Tensor | None,
             geom: Geometry) -> tuple[Tensor, int]:
        xd, wd, bd, _ = in_dims
        n = info.batch_size
        if wd is None and bd is None:  # one weight for the whole level: fold the level into the batch
            xs = _to_front(x, xd, n)
            assert xs is not None
            out = _Conv.apply(xs.flatten(0, 1), w, b, geom)
            return out.unflatten(0, (n, xs.shape[1])), 0
        xs, ws, bs = _to_front(x, xd, n), _to_front(w, wd, n), _to_front(b, bd, n)
        assert xs is not None and ws is not None
        outs = _each(n, lambda i: _Conv.apply(xs[i], ws[i], None if bs is None else bs[i], geom), xs)
        return torch.stack(outs), 0


class _ConvBackward(torch.autograd.Function):
    """The data and weight gradients of ``_Conv`` (``aten.convolution_backward``), looping under ``vmap``."""

    @staticmethod
    def forward(grad_out: Tensor, x: Tensor, w: Tensor, geom: Geometry,  # type: ignore[override]
                need: tuple[bool, bool]) -> tuple[Tensor, Tensor]:
        stride, padding, dilation = geom
        low = grad_out.dtype  # under autocast (train.perf.autocast) the forward ran in it: so does its backward
        gx, gw, _ = torch.ops.aten.convolution_backward(
            grad_out, x.to(low), w.to(low), None, list(stride), list(padding), list(dilation), False, [0, 0], 1,
            [need[0], need[1], False])
        # an unneeded gradient comes back as None: a broadcast zero (no memory, no kernel) keeps the outputs'
        # structure fixed for vmap and graphs; _Conv.backward drops it
        return (gx.to(x.dtype) if gx is not None else x.new_zeros(()).expand_as(x),
                gw.to(w.dtype) if gw is not None else w.new_zeros(()).expand_as(w))

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        pass  # nothing to save: the backward only refuses (not marked non-differentiable: that would be silent)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[None, ...]:  # type: ignore[override]
        raise RuntimeError("train.conv looped: second derivatives of a convolution are not provided")

    @staticmethod
    def vmap(info: Any, in_dims: tuple[Any, ...], grad_out: Tensor, x: Tensor, w: Tensor, geom: Geometry,
             need: tuple[bool, bool]) -> tuple[tuple[Tensor, Tensor], tuple[int | None, int | None]]:
        gd, xd, wd, _, _ = in_dims
        n = info.batch_size
        if wd is None and not need[1]:  # one weight, only the data gradient: fold the level into the batch
            gs, xs = _to_front(grad_out, gd, n), _to_front(x, xd, n)
            assert gs is not None and xs is not None
            gx, gw = _ConvBackward.apply(gs.flatten(0, 1), xs.flatten(0, 1), w, geom, need)
            return (gx.unflatten(0, (n, gs.shape[1])), gw), (0, None)
        # a weight gradient per entry (each client's, or local DP's per sample) even where the weight is shared
        gs, xs, ws = _to_front(grad_out, gd, n), _to_front(x, xd, n), _to_front(w, wd, n)
        assert gs is not None and xs is not None and ws is not None
        parts = _each(n, lambda i: _ConvBackward.apply(gs[i], xs[i], ws[i], geom, need), xs)
        # an unneeded gradient is the same broadcast zero for every entry: returned unbatched, never stacked
        gx = torch.stack([p[0] for p in parts]) if need[0] else parts[0][0]
        gw = torch.stack([p[1] for p in parts]) if need[1] else parts[0][1]
        return (gx, gw), (0 if need[0] else None, 0 if need[1] else None)


def looped_conv2d(x: Tensor, w: Tensor, b: Tensor | None, geom: Geometry) -> Tensor:
    """``F.conv2d(x, w, b, *geom)``; under ``vmap`` with a batched weight, one convolution per batch entry."""
    return _Conv.apply(x, w, b, geom)  # type: ignore[no-any-return]
