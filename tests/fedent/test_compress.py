"""fedent.compress: int8 is unbiased, seeded and 1 byte per entry; top-k keeps the largest entries and carries
the rest as the residual (error feedback: the sum of what is sent and what is left is the input); malformed codes
are refused before they index anything."""

from __future__ import annotations

import pytest
import torch

from fedent import compress


def test_int8_is_unbiased_seeded_and_bounded() -> None:
    d = [torch.linspace(-1, 1, 101), torch.full((3, 2), 0.3)]
    base = [torch.zeros(101), torch.zeros(3, 2)]
    mean = [torch.zeros(101), torch.zeros(3, 2)]
    n = 400
    for rnd in range(n):
        codes, left = compress.encode(d, "int8", seed=1, rnd=rnd, cid=2)
        assert left is None and codes[compress.INT8_CODES][0].dtype == torch.int8
        for m, x in zip(mean, compress.decode(base, codes), strict=True):
            m += x / n
            assert (x - d[0 if x.numel() == 101 else 1]).abs().max() <= 1 / 127 + 1e-6  # one step of the grid
    assert all(float((m - x).abs().max()) < 0.01 for m, x in zip(mean, d, strict=True))
    a, _ = compress.encode(d, "int8", seed=1, rnd=5, cid=2)
    b, _ = compress.encode(d, "int8", seed=1, rnd=5, cid=2)
    c, _ = compress.encode(d, "int8", seed=1, rnd=5, cid=3)
    assert torch.equal(a[compress.INT8_CODES][0], b[compress.INT8_CODES][0])
    assert not torch.equal(a[compress.INT8_CODES][0], c[compress.INT8_CODES][0])


def test_topk_keeps_the_largest_and_feeds_the_rest_back() -> None:
    d = [torch.tensor([0.1, -5.0, 0.2, 3.0, -0.05, 0.0])]
    res = [torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 0.0])]
    codes, left = compress.encode(d, "topk", seed=0, rnd=0, cid=0, fraction=0.5, residual=res)
    assert codes[compress.TOPK_INDEX][0].tolist() == [1, 3, 4]  # |x| = 5, 3, 0.95 with the residual added
    assert left is not None
    sent = compress.decode([torch.zeros(6)], codes)[0]
    assert torch.allclose(sent + left[0], d[0] + res[0])
    assert left[0].tolist() == pytest.approx([0.1, 0.0, 0.2, 0.0, 0.0, 0.0])


@pytest.mark.parametrize("kind", ["int8", "topk"])
def test_codes_that_do_not_fit_the_model_are_refused(kind: str) -> None:
    like = [torch.zeros(4)]
    codes, _ = compress.encode([torch.ones(4)], kind, seed=0, rnd=0, cid=0, fraction=0.5)
    compress.check_codes(codes, like)
    with pytest.raises(ValueError, match="does not fit|has 2"):
        compress.check_codes(codes, like * 2)
    if kind == "topk":
        codes[compress.TOPK_INDEX][0][0] = 9
        with pytest.raises(ValueError, match="outside"):
            compress.check_codes(codes, like)
    else:
        with pytest.raises(ValueError, match="does not fit"):
            compress.check_codes(codes, [torch.zeros(5)])
