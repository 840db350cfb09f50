"""fedent.params: ``all_finite``'s fast path (one float64 sum per tensor) says exactly what an element-wise check
says, including where a sum alone would mislead (a float64 sum that overflows)."""

from __future__ import annotations

import pytest
import torch

from fedent.params import all_finite


def elementwise(params: list[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in params)


BIG32 = torch.finfo(torch.float32).max
BIG64 = torch.finfo(torch.float64).max


@pytest.mark.parametrize("case", [
    [torch.randn(5, 3), torch.randn(4)],
    [torch.randn(5, 3), torch.tensor([1.0, float("inf")])],
    [torch.tensor([float("-inf")]), torch.randn(2)],
    [torch.tensor([float("nan"), 1.0])],
    [torch.tensor([float("inf"), float("-inf")])],  # a sum of nan: still caught
    [torch.full((1000,), BIG32)],  # its float32 sum overflows; every element is finite
    [torch.full((4,), BIG64, dtype=torch.float64)],  # its float64 sum overflows: the element-wise check decides
    [torch.full((4,), BIG64, dtype=torch.float64), torch.tensor([float("nan")], dtype=torch.float64)],
    [torch.randn(3, dtype=torch.bfloat16), torch.tensor([float("inf")], dtype=torch.bfloat16)],
    [torch.arange(5), torch.randn(3)],  # integer tensors are finite
    [torch.tensor([complex(1, float("inf"))])],
    [torch.randn(3, dtype=torch.complex64)],
    [],
])
def test_all_finite_agrees_with_the_element_wise_check(case: list[torch.Tensor]) -> None:
    assert all_finite(case) == elementwise(case)


def test_all_finite_answers_both_ways() -> None:
    """What the agreement is worth: the cases above hold both answers."""
    assert all_finite([torch.full((1000,), BIG32), torch.full((4,), BIG64, dtype=torch.float64)])
    assert not all_finite([torch.randn(100), torch.tensor([0.0, float("nan")])])
