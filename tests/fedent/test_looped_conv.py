"""``fedent.looped_conv``: the same function and gradients as ``F.conv2d`` under every vmap nesting the trainer uses."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, grad_and_value, vmap

from fedent.conv_forms import LoopedConv2d
from fedent.looped_conv import Geometry, looped_conv2d

C, B = 3, 4
TOL = 1e-5
GEOMETRIES: list[Geometry] = [((1, 1), (2, 2), (1, 1)), ((2, 1), (1, 0), (2, 1))]  # stride, padding, dilation


def net(looped: bool, geom: Geometry) -> nn.Module:
    """Two convolutions (the second's data gradient is needed, the first's is not) and a linear head."""
    stride, padding, dilation = geom
    convs = [nn.Conv2d(1, 4, 3, stride=stride, padding=padding, dilation=dilation), nn.Conv2d(4, 3, 3, padding=1)]
    if looped:
        convs = [LoopedConv2d.of(c) for c in convs]
    return nn.Sequential(convs[0], nn.ReLU(), convs[1], nn.ReLU(), nn.Flatten(), nn.LazyLinear(5))


def setup(geom: Geometry) -> tuple[nn.Module, nn.Module, dict[str, Tensor], Tensor, Tensor]:
    torch.manual_seed(0)
    direct, looped = net(False, geom), net(True, geom)
    x = torch.randn(C, B, 1, 10, 10)
    direct(x[0]), looped(x[0])  # materialise the lazy head
    looped.load_state_dict(direct.state_dict())
    params = {n: torch.randn(C, *p.shape) * 0.3 for n, p in direct.named_parameters()}  # a model per client
    return direct, looped, params, x, torch.randint(0, 5, (C, B))


def loss_of(model: nn.Module) -> Callable[[dict[str, Tensor], Tensor, Tensor], Tensor]:
    def loss(params: dict[str, Tensor], xb: Tensor, yb: Tensor) -> Tensor:
        return F.cross_entropy(functional_call(model, params, (xb,)), yb)
    return loss


def diff(a: dict[str, Tensor], b: dict[str, Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("geom", GEOMETRIES)
def test_forward_and_per_client_gradients_equal_the_grouped_convolution(geom: Geometry) -> None:
    """The trainer's step: vmap over clients of grad_and_value, a model per client."""
    direct, looped, params, x, y = setup(geom)
    (gd, vd), (gl, vl) = (vmap(grad_and_value(loss_of(m)))(params, x, y) for m in (direct, looped))
    assert float((vd - vl).abs().max()) <= TOL and diff(gd, gl) <= TOL
    assert min(float(g.abs().max()) for g in gl.values()) > 1e-4  # every parameter got a real gradient
    out = looped_conv2d(x[0], params["0.weight"][0], params["0.bias"][0], geom)  # no vmap: plain F.conv2d
    stride, padding, dilation = geom
    want = F.conv2d(x[0], params["0.weight"][0], params["0.bias"][0], stride, padding, dilation)
    assert out.shape == want.shape and float((out - want).abs().max()) <= TOL


def test_one_point_many_batches_gives_each_batchs_gradient() -> None:
    """FedEnt's probes: one shared model, a gradient per client's batch (the weight is not batched)."""
    direct, looped, params, x, y = setup(GEOMETRIES[0])
    point = {n: p[0] for n, p in params.items()}
    gd, gl = (vmap(grad(loss_of(m)), in_dims=(None, 0, 0))(point, x, y) for m in (direct, looped))
    assert diff(gd, gl) <= TOL
    assert float((gl["0.weight"][0] - gl["0.weight"][1]).abs().max()) > 1e-4  # per batch, not summed


def test_per_sample_gradients_inside_per_client_vmap_equal_the_direct_ones() -> None:
    """Local DP: vmap over clients of vmap over samples (a shared weight at the inner level)."""
    direct, looped, params, x, y = setup(GEOMETRIES[1])

    def per_sample(m: nn.Module) -> Callable[..., dict[str, Tensor]]:
        def one(p: dict[str, Tensor], xs: Tensor, ys: Tensor) -> Tensor:
            return loss_of(m)(p, xs.unsqueeze(0), ys.unsqueeze(0))
        return vmap(vmap(grad(one), in_dims=(None, 0, 0)))

    gd, gl = per_sample(direct)(params, x, y), per_sample(looped)(params, x, y)
    assert gl["0.weight"].shape == (C, B, *params["0.weight"].shape[1:]) and diff(gd, gl) <= TOL


def test_a_second_derivative_is_refused_with_a_message() -> None:
    _, looped, params, x, y = setup(GEOMETRIES[0])
    point = {n: p[0] for n, p in params.items()}
    with pytest.raises(RuntimeError, match="second derivatives"):
        grad(lambda p: sum(g.sum() for g in grad(loss_of(looped))(p, x[0], y[0]).values()))(point)
