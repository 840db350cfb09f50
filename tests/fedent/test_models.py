"""The paper's models: exact parameter counts, shapes for any dataset pairing, no buffers, seeded init."""

from __future__ import annotations

import pytest
import torch

from fedent.models import DEFAULT_MODEL, MODELS, build_model, count_parameters

# (model, classes, channels, size) -> parameters; computed by hand in the module docstrings.
PARAM_COUNTS = [
    ("mnist-cnn", 10, 1, 28, 1_663_370),
    ("cifar10-cnn", 10, 3, 32, 586_250),
    ("lenet5", 10, 1, 28, 61_706),
    ("lenet5", 26, 1, 28, 63_066),
    ("vgg11", 10, 3, 32, 9_231_114),
    ("vgg11", 100, 3, 32, 9_277_284),
]


@pytest.mark.parametrize("name,classes,channels,size,expected", PARAM_COUNTS)
def test_parameter_counts(name: str, classes: int, channels: int, size: int, expected: int) -> None:
    assert count_parameters(build_model(name, classes, channels, size)) == expected


def test_mnist_cnn_count_by_hand() -> None:
    """1,663,370 = conv(1->32,5x5) + conv(32->64,5x5) + fc(3136->512) + fc(512->10)."""
    by_hand = (32 * 25 + 32) + (64 * 32 * 25 + 64) + (3136 * 512 + 512) + (512 * 10 + 10)
    assert by_hand == 1_663_370 == count_parameters(build_model("mnist-cnn", 10, 1, 28))


def test_cifar10_cnn_count_by_hand() -> None:
    by_hand = (32 * 27 + 32) + (64 * 32 * 9 + 64) + (64 * 64 * 9 + 64) + (1024 * 512 + 512) + (512 * 10 + 10)
    assert by_hand == 586_250


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("channels,size", [(1, 28), (3, 32)])
def test_forward_shape_any_pairing(name: str, channels: int, size: int) -> None:
    model = build_model(name, 7, channels, size)
    with torch.no_grad():
        out = model(torch.randn(3, channels, size, size))
    assert out.shape == (3, 7)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_no_buffers(name: str) -> None:
    model = build_model(name, 10, 3, 32, dropout=0.5)
    assert list(model.buffers()) == []
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_init_is_deterministic_and_seeded(name: str) -> None:
    a = build_model(name, 10, 1, 28, seed=3)
    b = build_model(name, 10, 1, 28, seed=3)
    c = build_model(name, 10, 1, 28, seed=4)
    pa, pb, pc = list(a.parameters()), list(b.parameters()), list(c.parameters())
    assert all(torch.equal(x, y) for x, y in zip(pa, pb, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(pa, pc, strict=True))


def test_dropout_does_not_change_init() -> None:
    """Dropout has no parameters, so the same seed gives the same weights with or without it."""
    a = build_model("mnist-cnn", 10, 1, 28, dropout=0.0, seed=1)
    b = build_model("mnist-cnn", 10, 1, 28, dropout=0.3, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert any(isinstance(m, torch.nn.Dropout) and m.p == 0.3 for m in b.modules())


def test_global_rng_untouched() -> None:
    torch.manual_seed(123)
    before = torch.get_rng_state()
    expected_next = torch.rand(4)
    torch.set_rng_state(before)
    build_model("lenet5", 26, 1, 28, seed=9)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(torch.rand(4), expected_next)


def test_default_models_cover_datasets() -> None:
    from fedent.data.datasets import DATASETS

    assert set(DEFAULT_MODEL) == set(DATASETS)
    assert set(DEFAULT_MODEL.values()) <= set(MODELS)


@pytest.mark.parametrize(
    "args,match",
    [
        (("resnet", 10, 1, 28), "unknown model"),
        (("mnist-cnn", 0, 1, 28), ">= 1"),
        (("mnist-cnn", 10, 1, 3), "too small"),
        (("lenet5", 10, 1, 8), "too small"),
    ],
)
def test_bad_arguments_are_clear(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_model(*args)


def test_bad_dropout() -> None:
    with pytest.raises(ValueError, match="dropout"):
        build_model("mnist-cnn", 10, 1, 28, dropout=1.0)
