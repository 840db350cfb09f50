"""Paired seed statistics against hand-computed numbers."""

import math

import pytest

from fedent.experiments import paired as P


def test_paired_interval_hand_computed():
    # diffs 0.02, 0.04, 0.06: mean 0.04, sd 0.02, half = 4.303 * 0.02 / sqrt(3) = 0.049688
    p = P.paired({0: 0.82, 1: 0.84, 2: 0.86, 3: 0.9}, {0: 0.80, 1: 0.80, 2: 0.80})
    assert p is not None and p.n == 3
    assert p.mean == pytest.approx(0.04)
    assert p.lo == pytest.approx(0.04 - 0.0496868, abs=1e-6)
    assert p.hi == pytest.approx(0.04 + 0.0496868, abs=1e-6)
    assert P.fmt(p) == "+4.00 [-0.97, +8.97] (n = 3)"


def test_one_seed_says_n1_never_zero_spread():
    p = P.paired({5: 0.9}, {5: 0.85, 6: 0.1})
    assert p == P.Paired(1, pytest.approx(0.05), None, None)
    assert P.fmt(p) == "+5.00 (n = 1, no interval)"
    assert "±" not in P.fmt(p)
    assert P.paired({1: None}, {1: 0.5}) is None and P.fmt(None) == "—"


def test_t_quantiles():
    assert P.t975(1) == 12.706 and P.t975(2) == 4.303 and P.t975(30) == 2.042
    assert P.t975(60) == pytest.approx(2.000, abs=1e-3)  # table value 2.000
    assert P.t975(120) == pytest.approx(1.980, abs=1e-3)
    with pytest.raises(ValueError):
        P.t975(0)


def test_tail_mean_skips_unevaluated_rounds():
    recs = [{"test_acc": 0.1}, {"test_acc": None}, {"test_acc": 0.5}, {}, {"test_acc": 0.7}, {"test_acc": 0.9}]
    assert P.tail_mean(recs, 3) == pytest.approx((0.5 + 0.7 + 0.9) / 3)
    assert P.tail_mean(recs, 1) == pytest.approx(0.9)
    assert P.tail_mean(recs, 10) == pytest.approx(2.2 / 4)
    assert P.tail_mean([{}], 3) is None
    assert math.isclose(P.tail_mean([{"test_acc": 0.3}]), 0.3)
