"""Spatial-size arithmetic, so any model accepts any dataset's image shape (e.g. 1x28x28 into VGG-11)."""

from __future__ import annotations


def after_pools(size: int, pools: int, name: str, ceil: bool = False) -> int:
    """Side length after ``pools`` 2x2/stride-2 max-pools; a clear error if the image is too small."""
    s = size
    for _ in range(pools):
        s = (s + 1) // 2 if ceil else s // 2
    if s < 1:
        raise ValueError(f"model {name}: image size {size} is too small for {pools} 2x2 poolings")
    return s
